"""Logging of procgroup and its backends: ``PROCGROUP_LOG_LEVEL`` and rank-prefixed lines.

``PROCGROUP_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR, CRITICAL or a number; like torch's
``TORCH_CPP_LOG_LEVEL``) sets the level of the ``procgroup`` logger and of the backend's
(``procgroup_tcp``...). Unset, the levels are left alone (Python's default shows WARNING
and above).

Where the program has not configured logging itself (the root logger has no handler), the
records of these loggers are printed to stderr as ``[rank 3] WARNING procgroup.x: message``
instead of Python's bare last-resort ``message``: with many ranks writing to one terminal,
a line must say whose it is. Before the world exists the rank is the launcher's (RANK, or
mpirun's, PMI's, PMIx's or srun's variable). The rank part is left out when none is set, and under
``procgroup-run``, whose own ``[rank3]: `` prefix already says it. A program that configures
logging (``logging.basicConfig``...) gets the records through its own handlers, once.

:func:`configure` is called by ``init_process_group`` (idempotent).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from .errors import InvalidArgumentError

ENV_LEVEL = "PROCGROUP_LOG_LEVEL"
ENV_PREFIXED = "PROCGROUP_OUTPUT_PREFIXED"  # set by procgroup-run when it prefixes lines
ROOT_LOGGER = "procgroup"
_NAMES = ("CRITICAL", "FATAL", "ERROR", "WARNING", "WARN", "INFO", "DEBUG", "NOTSET")

RankGetter = Callable[[], int | None]
_rank_getter: RankGetter | None = None
_handler: logging.Handler | None = None


def level_from_env(environ: dict[str, str] | None = None) -> int | None:
    """The level $PROCGROUP_LOG_LEVEL names, None when unset; a bad value is an error."""
    raw = (os.environ if environ is None else environ).get(ENV_LEVEL, "").strip()
    if not raw:
        return None
    if raw.lstrip("-").isdigit():
        return int(raw)
    name = raw.upper()
    if name in _NAMES:
        return int(logging.getLevelName(name if name != "WARN" else "WARNING"))
    raise InvalidArgumentError(
        f"{ENV_LEVEL}={raw!r}: use one of DEBUG, INFO, WARNING, ERROR, CRITICAL (or a number)"
    )


#: Launchers' rank variables, first set wins: the order env:// believes them in
#: (rendezvous/_env.py), an MPI launcher's before Slurm's, because mpiexec inside a Slurm step
#: inherits the step's SLURM_PROCID
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def current_rank() -> int | None:
    """This process's rank: from the world once it exists, else the first launcher variable
    of :data:`RANK_VARS` that is set (srun, mpiexec, mpirun ranks are tagged before init too),
    else None."""
    if _rank_getter is not None:
        try:
            rank = _rank_getter()
        except Exception:  # noqa: BLE001  (logging must never fail)
            rank = None
        if rank is not None and rank >= 0:
            return rank
    for var in RANK_VARS:
        env = os.environ.get(var, "").strip()
        if env.isdigit():
            return int(env)
    return None


class _RankFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        rank = None if os.environ.get(ENV_PREFIXED) == "1" else current_rank()
        if rank is None:
            return text
        prefix = f"[rank {rank}] "
        return "\n".join(prefix + line for line in text.split("\n"))


class _UnlessConfigured(logging.Filter):
    """Pass records only while the program has no logging of its own (no root handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def configure(backend_package: str | None = None, rank: RankGetter | None = None) -> None:
    """Apply $PROCGROUP_LOG_LEVEL and install the rank-prefixed stderr handler (once)."""
    global _rank_getter, _handler
    level = level_from_env()
    if rank is not None:
        _rank_getter = rank
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(_RankFormatter("%(levelname)s %(name)s: %(message)s"))
        _handler.addFilter(_UnlessConfigured())
    names = [ROOT_LOGGER]
    if backend_package and backend_package != ROOT_LOGGER:
        names.append(backend_package)
    for name in names:
        logger = logging.getLogger(name)
        if level is not None:
            logger.setLevel(level)
        if _handler not in logger.handlers:
            logger.addHandler(_handler)


__all__ = ["ENV_LEVEL", "configure", "current_rank", "level_from_env"]
