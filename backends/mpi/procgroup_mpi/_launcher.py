"""The world MPI reports, checked against the launcher that started this process.

A task that MPI calls a world of 1 although its launcher started N > 1 of them is one of N
separate worlds: every rank would "succeed" alone. The classic case is Slurm's plain
``srun`` (no ``--mpi=pmi2``, the default on many clusters): the tasks get SLURM_NTASKS=N
but no process-management interface, so each MPI_Init makes a singleton. The mpi backend
refuses that world with an error that names the fix.

Which launcher's count is believed: an MPI launcher's own variable first (Open MPI's
OMPI_COMM_WORLD_SIZE, PMI's PMI_SIZE, PMIx's PMIX_SIZE), since ``mpiexec`` run inside a
Slurm step inherits the step's SLURM_NTASKS without meaning it; SLURM_NTASKS only inside a
job step (SLURM_STEP_ID set to a real step), not in a batch script that runs the program
itself once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from procgroup.errors import InvalidArgumentError

#: (variable, who sets it), believed in this order
MPI_SIZE_VARS = (
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"),
    ("PMI_SIZE", "a PMI launcher (MPICH's mpiexec, srun --mpi=pmi2)"),
    ("PMIX_SIZE", "a PMIx launcher"),
)
#: Slurm's reserved step ids (batch, extern, interactive ...) start here
_RESERVED_STEP_ID = 0xFFFFFFF0


def _count(environ: Mapping[str, str], var: str) -> int | None:
    value = environ.get(var, "").strip()
    return int(value) if value.isdigit() else None


def launcher_size(environ: Mapping[str, str] | None = None) -> tuple[int | None, str, str]:
    """(the task count a launcher announced, its variable, who sets it); (None, "", "") if none."""
    env = os.environ if environ is None else environ
    for var, who in MPI_SIZE_VARS:
        n = _count(env, var)
        if n is not None:
            return n, var, who
    step = _count(env, "SLURM_STEP_ID")
    if step is not None and step < _RESERVED_STEP_ID:
        n = _count(env, "SLURM_NTASKS")
        if n is not None:
            return n, "SLURM_NTASKS", "srun"
    return None, "", ""


def check_world(size: int, environ: Mapping[str, str] | None = None) -> None:
    """Refuse MPI's world of 1 when the launcher started more tasks (module docstring)."""
    n, var, who = launcher_size(environ)
    if size != 1 or n is None or n <= 1:
        return
    if var == "SLURM_NTASKS":
        raise InvalidArgumentError(
            f"init_process_group('mpi'): MPI says this process is a world of 1, but srun started "
            f"{n} tasks ({var}={n}): without an MPI plugin srun gives the tasks no "
            f"process-management interface, so each one is a separate MPI world. Start the job "
            f"with `srun --mpi=pmi2 ...` (or `--mpi=pmix` where Slurm has PMIx; `srun --mpi=list` "
            f"shows them), or ask the administrators for MpiDefault=pmi2 in slurm.conf"
        )
    raise InvalidArgumentError(
        f"init_process_group('mpi'): MPI says this process is a world of 1, but {who} started "
        f"{n} processes ({var}={n}): the MPI library mpi4py loaded does not speak that "
        f"launcher's protocol, so each process is a separate MPI world. Start the job with the "
        f"mpiexec of the MPI that mpi4py uses (python -c 'import mpi4py.MPI as M; "
        f"print(M.Get_library_version())' names it), or under Slurm with `srun --mpi=pmi2`"
    )


__all__ = ["check_world", "launcher_size"]
