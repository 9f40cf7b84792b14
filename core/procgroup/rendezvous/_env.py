"""Environment variables read by ``env://``, parsed so that errors name the variable and its value.

Rank and world size come from the first of these that is set (an argument to
``rendezvous`` beats them all):

=============  ============================  ==========================
source         rank                          world size
=============  ============================  ==========================
procgroup      RANK                          WORLD_SIZE
Open MPI       OMPI_COMM_WORLD_RANK          OMPI_COMM_WORLD_SIZE
MPICH / PMI    PMI_RANK                      PMI_SIZE
PMIx           PMIX_RANK                     (none)
Slurm          SLURM_PROCID                  SLURM_NTASKS
=============  ============================  ==========================

Under Open MPI's mpirun, MASTER_ADDR defaults to mpirun's host and MASTER_PORT to a port
derived from mpirun's job (:mod:`procgroup.rendezvous._openmpi`). Inside a Slurm job,
MASTER_ADDR defaults to the first host of SLURM_STEP_NODELIST (else
SLURM_JOB_NODELIST), then to SLURM_LAUNCH_NODE_IPADDR, and MASTER_PORT to a port derived
from SLURM_JOB_ID and SLURM_STEP_ID (the rule is in :mod:`procgroup.rendezvous._slurm`).
Elsewhere MASTER_PORT has no default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from procgroup.errors import InvalidArgumentError

from . import _openmpi, _slurm

#: (rank variable, size variable or None), in order of precedence.
RANK_SOURCES: tuple[tuple[str, str | None], ...] = (
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("PMIX_RANK", None),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)
_RANKS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_HOSTS = ("MASTER_ADDR", "SLURM_LAUNCH_NODE_IPADDR")
_SLURM_TEXT = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_LAUNCH_NODE_IPADDR",
               "SLURM_JOB_ID", "SLURM_STEP_ID")
_TEXT = (*_SLURM_TEXT, "PMIX_NAMESPACE", "PMIX_HOSTNAME", "OMPI_COMM_WORLD_LOCAL_SIZE")
FIELDS = ("MASTER_ADDR", "MASTER_PORT", *_RANKS, *_SIZES, *_TEXT)


_WHOLE = re.compile(r"[+-]?[0-9]+")


def _whole_number(raw: str, minimum: int, maximum: int | None = None) -> int:
    """``raw`` as an int in [minimum, maximum]; ValueError with procgroup's wording."""
    if _WHOLE.fullmatch(raw) is None:
        raise ValueError("must be a whole number")
    value = int(raw)
    if value < minimum:
        raise ValueError(f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"must be <= {maximum}")
    return value


def _host(raw: str) -> str:
    if any(c.isspace() for c in raw):
        raise ValueError("must be a host name or IP address without spaces")
    return raw


def _parse(name: str, raw: str) -> int | str:
    """One variable's value (already stripped, never empty), by the variable's kind."""
    if name == "MASTER_PORT":
        return _whole_number(raw, 1, 65535)
    if name in _RANKS:
        return _whole_number(raw, 0)
    if name in _SIZES:
        return _whole_number(raw, 1)
    if name in _HOSTS:
        return _host(raw)
    return raw


class RendezvousEnv:
    """The variables env:// understands, validated; unset or empty ones are None."""

    #: The variables' names (for callers that list them).
    model_fields: dict[str, None] = dict.fromkeys(FIELDS)

    MASTER_ADDR: str | None = None
    MASTER_PORT: int | None = None
    RANK: int | None = None
    WORLD_SIZE: int | None = None
    OMPI_COMM_WORLD_RANK: int | None = None
    OMPI_COMM_WORLD_SIZE: int | None = None
    PMI_RANK: int | None = None
    PMI_SIZE: int | None = None
    PMIX_RANK: int | None = None
    SLURM_PROCID: int | None = None
    SLURM_NTASKS: int | None = None
    SLURM_STEP_NODELIST: str | None = None
    SLURM_JOB_NODELIST: str | None = None
    SLURM_LAUNCH_NODE_IPADDR: str | None = None
    SLURM_JOB_ID: str | None = None
    SLURM_STEP_ID: str | None = None
    PMIX_NAMESPACE: str | None = None
    PMIX_HOSTNAME: str | None = None
    OMPI_COMM_WORLD_LOCAL_SIZE: str | None = None

    def __init__(self, **values: Any) -> None:
        for k, v in values.items():
            setattr(self, k, v)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], scheme: str = "env://") -> RendezvousEnv:
        """Validate the known variables of ``environ``; errors name variable and value."""
        raw = {k: environ[k].strip() for k in FIELDS if environ.get(k, "").strip()}
        values: dict[str, int | str] = {}
        problems = []
        for name, text in raw.items():
            try:
                values[name] = _parse(name, text)
            except ValueError as exc:
                problems.append(f"environment variable {name}={text!r} is invalid: {exc}")
        if problems:
            raise InvalidArgumentError(f"{scheme}: " + "; ".join(problems))
        return cls(**values)

    def rank_and_source(self) -> tuple[int | None, str]:
        """The rank and the variable it came from (None, '' when unset)."""
        for rank_var, _ in RANK_SOURCES:
            value = getattr(self, rank_var)
            if value is not None:
                return value, rank_var
        return None, ""

    def size_and_source(self) -> tuple[int | None, str]:
        """The world size and the variable it came from (None, '' when unset)."""
        for _, size_var in RANK_SOURCES:
            if size_var is not None and getattr(self, size_var) is not None:
                return getattr(self, size_var), size_var
        return None, ""

    def _launcher(self) -> dict[str, str]:
        names = (*_TEXT, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
        return {k: str(v) for k in names if (v := getattr(self, k)) is not None}

    def master_addr_and_source(self) -> tuple[str | None, str]:
        """MASTER_ADDR, else Open MPI's mpirun host, else the step's (or job's) first Slurm
        node, else the Slurm launch node."""
        if self.MASTER_ADDR:
            return self.MASTER_ADDR, "MASTER_ADDR"
        host = _openmpi.mpirun_host(self._launcher())
        if host is not None:
            return host, "PMIX_NAMESPACE (mpirun's host)"
        addr, var = _slurm.master_addr(self._launcher())
        if addr is not None:
            return addr, var
        if self.SLURM_LAUNCH_NODE_IPADDR:
            return self.SLURM_LAUNCH_NODE_IPADDR, "SLURM_LAUNCH_NODE_IPADDR"
        return None, ""

    def master_port_and_source(self) -> tuple[int | None, str]:
        """MASTER_PORT, else the port derived from Open MPI's mpirun job, else from the
        Slurm job and step ids."""
        if self.MASTER_PORT is not None:
            return self.MASTER_PORT, "MASTER_PORT"
        port = _openmpi.master_port(self._launcher())
        if port is not None:
            return port, "PMIX_NAMESPACE (mpirun's pid and job)"
        port = _slurm.master_port(self._launcher())
        if port is not None:
            return port, "SLURM_JOB_ID and SLURM_STEP_ID"
        return None, ""


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``"gpu[07-09,12],cpu1"`` -> ``"gpu07"``."""
    return _slurm.first_host(nodelist, "SLURM_JOB_NODELIST")
