"""What env:// reads from Open MPI's mpirun (5.x, PRRTE) when MASTER_ADDR/MASTER_PORT are unset.

Every process mpirun starts has OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (env:// takes
rank and size from them) and ``PMIX_NAMESPACE=prterun-<mpirun's host>-<mpirun's pid>@<job>``.
From the namespace:

- MASTER_ADDR defaults to mpirun's host. Open MPI places rank 0 on the first node of the
  allocation, which is where mpirun runs in the usual case (a batch script, one machine);
  when mpirun runs on a node that gets no ranks (a login node), set MASTER_ADDR. When
  every rank runs on mpirun's host (OMPI_COMM_WORLD_LOCAL_SIZE equals the world size and
  PMIX_HOSTNAME is mpirun's host) it is 127.0.0.1: nothing leaves the machine, which
  needs no job token.
- MASTER_PORT defaults to ``10000 + (pid mod 1000) * 10 + (job mod 10)``: the same on every
  rank, different for two mpiruns on one host unless their pids are equal modulo 1000.
  The range 10000-19999 is its own: an mpirun inside a Slurm job never takes a port of
  Slurm's rule (:mod:`._slurm`, 20000-29999), and both stay below Linux's ephemeral
  ports (32768 and up).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from . import _slurm

#: the first port of Open MPI's range (10000-19999, below Slurm's)
PORT_BASE = 10000

_NAMESPACE = re.compile(r"^prterun-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)@(?P<job>\d+)$")


def _namespace(environ: Mapping[str, str]) -> re.Match[str] | None:
    if not environ.get("OMPI_COMM_WORLD_RANK", "").strip():
        return None  # a PMIx namespace of another launcher (srun --mpi=pmix) says nothing here
    return _NAMESPACE.match(environ.get("PMIX_NAMESPACE", "").strip())


def mpirun_host(environ: Mapping[str, str]) -> str | None:
    """The host mpirun runs on (from PMIX_NAMESPACE; loopback when the whole job runs
    there), or None outside Open MPI's mpirun."""
    m = _namespace(environ)
    if m is None:
        return None
    local, size = (environ.get(k, "").strip() for k in ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE"))
    if local and local == size and environ.get("PMIX_HOSTNAME", "").strip() == m.group("host"):
        return "127.0.0.1"
    return m.group("host")


def master_port(environ: Mapping[str, str]) -> int | None:
    """The port the module docstring's rule gives this mpirun job, or None outside one."""
    m = _namespace(environ)
    if m is None:
        return None
    pid, job = int(m.group("pid")), int(m.group("job"))
    return PORT_BASE + (pid % _slurm.JOBS) * _slurm.STEPS_PER_JOB + job % _slurm.STEPS_PER_JOB


__all__ = ["master_port", "mpirun_host"]
