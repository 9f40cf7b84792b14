"""Does this MPI's fault tolerance (ULFM) work? A standalone mpi4py probe (issue 17).

procgroup's mpi backend refuses revoke/agree/shrink (docs/fault-tolerance.md, "mpi");
this script is the evidence behind the refusal, and the check to rerun on another MPI.
Start it with 4 ranks and the launcher's flags that keep survivors::

    .venv313/bin/mpiexec -n 4 -disable-auto-cleanup .venv313/bin/python bench/ulfm_probe.py
    mpiexec --with-ft ulfm --mca mpi_ft_detector true -n 4 python bench/ulfm_probe.py

Rank ``--victim`` (2) exits with ``os._exit``; each survivor then prints one line per
step, saying what the library answered: the death seen by a pending ``Iallreduce``
(MPI_ERR_PROC_FAILED), ``Revoke``, ``Shrink``, an ``Allreduce`` on the shrunk
communicator (exact sum), ``Agree``, and ``MPI_Finalize``. Every wait is bounded
(``--wait`` seconds): a blocking call that hangs ends its process, after a line saying
it was called; one known to hang (mpi4py's fallback ``Shrink`` and ``Agree`` when
``Revoke`` is missing) is not made. Only mpi4py's API is used: calling
MPICH's MPIX_ symbols directly on its ch4 device aborts the process.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--victim", type=int, default=2)
    parser.add_argument("--wait", type=float, default=10.0, help="seconds each step may take")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    world.Set_errhandler(MPI.ERRORS_RETURN)
    comm = world.Dup()
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank = comm.Get_rank()
    t0 = time.monotonic()

    def say(step: str, answer: str) -> None:
        print(f"rank {rank} [{time.monotonic() - t0:7.3f}s] {step}: {answer}", flush=True)

    if rank == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0].strip()}; ERR_PROC_FAILED={MPI.ERR_PROC_FAILED} "
              f"ERR_REVOKED={MPI.ERR_REVOKED} ERR_UNKNOWN={MPI.ERR_UNKNOWN} "
              f"(all three equal: mpi4py has no ULFM binding)", flush=True)
    comm.Barrier()
    if rank == args.victim:
        time.sleep(0.2)  # the others are in the Iallreduce by now
        os._exit(3)
    buf = np.ones(4)
    say("death", poll(comm.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM), args.wait))
    wait = args.wait
    revoked = step(say, wait, "Revoke", lambda: comm.Revoke() or f"Is_revoked={comm.Is_revoked()}")
    if not revoked:
        say("Shrink/Agree", "not called: without Revoke, mpi4py's fallbacks (MPI_Comm_dup, MPI_Allreduce) "
            "wait for the dead rank forever")
    else:
        shrunk: list[Any] = []
        step(say, wait, "Shrink", lambda: shrunk.append(comm.Shrink()) or f"size {shrunk[0].Get_size()}")
        if shrunk:
            new = shrunk[0]
            new.Set_errhandler(MPI.ERRORS_RETURN)
            x = np.array([float(new.Get_rank() + 1)])
            expected = sum(range(1, new.Get_size() + 1))
            step(say, wait, "Allreduce on the shrunk communicator",
                 lambda: new.Allreduce(MPI.IN_PLACE, x, MPI.SUM) or f"{x[0]:g} (exact: {expected})")
            step(say, wait, "Agree", lambda: f"{new.Agree(1)}")
    step(say, wait, "MPI_Finalize", lambda: MPI.Finalize() or "returned")
    os._exit(0)


def poll(req: Any, wait: float) -> str:
    """What a pending request says within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    try:
        while not req.Test():
            if time.monotonic() > deadline:
                return f"still pending after {wait:g}s (the library did not report the death)"
            time.sleep(0.001)
    except MPI.Exception as exc:
        return f"error class {exc.Get_error_class()}: {exc.Get_error_string().strip()}"
    return "completed (no error)"


def step(say: Callable[[str, str], None], wait: float, name: str, call: Callable[[], Any]) -> bool:
    """Run one blocking MPI call, print its answer; True when it returned.

    A call may hang holding the GIL (a blocking Shrink that never hears of the death,
    MPI_Finalize after one): faulthandler's watchdog, a C thread, then prints where the
    process stood and ends it after ``wait`` seconds."""
    say(name, f"called (if nothing follows within {wait:g}s, it hung and the process is ended)")
    faulthandler.dump_traceback_later(wait, exit=True)
    try:
        say(name, str(call()))
        return True
    except NotImplementedError:
        say(name, "NotImplementedError (mpi4py: MPI_ERR_UNSUPPORTED_OPERATION, no ULFM binding)")
    except MPI.Exception as exc:
        say(name, f"error class {exc.Get_error_class()}: {exc.Get_error_string().strip()}")
    finally:
        faulthandler.cancel_dump_traceback_later()
    return False


if __name__ == "__main__":
    main()
