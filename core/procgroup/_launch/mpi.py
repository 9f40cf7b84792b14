"""``procgroup-run --backend mpi``: find the mpiexec that starts the ranks as one MPI world.

Why the launcher goes through mpiexec at all: the mpi backend takes rank and size from MPI,
so ranks the launcher started itself would each be an MPI singleton, a world of 1 (the job
would "succeed" N times alone). Started by mpiexec they form one ``COMM_WORLD``. Which
mpiexec matters: it must belong to the MPI library mpi4py loads, so the one installed next
to this interpreter (the mpich wheel's) is preferred to whatever ``PATH`` finds first.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import sysconfig

from procgroup.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

MPIEXEC_ENV = "PROCGROUP_MPIEXEC"
MPI_BACKENDS = frozenset({"mpi"})


def wants_mpiexec(backend: str | None) -> bool:
    """True for a backend whose ranks must be started by mpiexec."""
    return backend is not None and backend.strip().lower() in MPI_BACKENDS


def _candidates() -> list[str]:
    found = []
    # next to the interpreter as invoked (a venv's bin/, even when python is a symlink)
    found.append(os.path.join(os.path.dirname(sys.executable), "mpiexec"))
    scripts = sysconfig.get_path("scripts")
    if scripts:
        found.append(os.path.join(scripts, "mpiexec"))
    # next to the resolved interpreter (a base installation's bin/)
    found.append(os.path.join(os.path.dirname(os.path.realpath(sys.executable)), "mpiexec"))
    for name in ("mpiexec", "mpirun"):
        on_path = shutil.which(name)
        if on_path:
            found.append(on_path)
    return found


def find_mpiexec() -> str:
    """$PROCGROUP_MPIEXEC, else mpiexec next to this Python, else on PATH; or a clear error."""
    given = os.environ.get(MPIEXEC_ENV)
    if given:
        path = shutil.which(given)
        if path is None:
            raise InvalidArgumentError(
                f"{MPIEXEC_ENV}={given!r} is not an executable program"
            )
        return path
    looked = []
    for path in _candidates():
        if path in looked:
            continue
        looked.append(path)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            logger.debug("using %s", path)
            return path
    raise InvalidArgumentError(
        "--backend mpi needs mpiexec to start the ranks as one MPI world (started one by one "
        "they would be N separate worlds of size 1), and none was found (looked at "
        f"{', '.join(looked) or 'PATH'}): pip install mpich (it puts mpiexec next to python), "
        f"or point {MPIEXEC_ENV} at the mpiexec of the MPI that mpi4py uses"
    )


def mpiexec_command(mpiexec: str, nproc: int, rank_command: list[str]) -> list[str]:
    """Start ``nproc`` copies of ``rank_command`` as one world (MPICH Hydra and Open MPI)."""
    return [mpiexec, "-n", str(nproc), *rank_command]
