"""Abort the whole MPI job when one rank dies of an uncaught exception.

Without this, the other ranks of an mpiexec job would sit in their next collective
until the timeout (or forever in code outside procgroup). ``python -m mpi4py script.py``
does the same: print the traceback, then ``MPI_Abort``, which makes mpiexec kill every
rank. Installed when mpiexec's world becomes procgroup's (``MpiChannel.discover_store``,
i.e. ``init_process_group("mpi")`` without an init method, more than one rank); removed
when that world's channel closes. Opt out with ``PROCGROUP_MPI_ABORT_ON_EXCEPTION=0``.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import Any

from procgroup.backend import env_flag

log = logging.getLogger(__name__)

ENV_ABORT = "PROCGROUP_MPI_ABORT_ON_EXCEPTION"

_previous: Any = None
_installed: Any = None


def wanted() -> bool:
    """False when $PROCGROUP_MPI_ABORT_ON_EXCEPTION says 0/false/no/off."""
    return env_flag(ENV_ABORT, True)


def install(comm: Any) -> None:
    """Chain a sys.excepthook that prints the error, then aborts ``comm`` (COMM_WORLD)."""
    global _previous, _installed
    if _installed is not None:
        return
    previous = sys.excepthook

    def abort_on_exception(etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        try:
            previous(etype, value, tb)
        finally:
            code = 130 if issubclass(etype, KeyboardInterrupt) else 1
            try:
                sys.stderr.write(
                    f"procgroup mpi: rank {comm.Get_rank()} raised {etype.__name__}; aborting the MPI job\n"
                )
                sys.stderr.flush()
                sys.stdout.flush()
                # mpiexec forwards our output through a pipe; Abort kills the job at once,
                # so give the forwarder a moment to read the traceback first
                time.sleep(0.3)
            finally:
                comm.Abort(code)

    _previous, _installed = previous, abort_on_exception
    sys.excepthook = abort_on_exception
    log.debug("installed the abort-on-exception hook")


def uninstall() -> None:
    """Put the previous excepthook back, unless someone replaced ours since."""
    global _previous, _installed
    if _installed is not None and sys.excepthook is _installed:
        sys.excepthook = _previous
    _previous = _installed = None


__all__ = ["ENV_ABORT", "install", "uninstall", "wanted"]
