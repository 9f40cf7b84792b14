"""Starting the ranks: under an existing launcher, or ``-np N`` processes on this host.

An existing launcher is recognized by its variables (RANK/WORLD_SIZE from procgroup-run
or torchrun, PMI_* from MPICH/Hydra, OMPI_COMM_WORLD_* from Open MPI); then this process
is one rank and nothing is spawned. Otherwise ``-np N`` ranks are started with env://
rendezvous on loopback, under ``mpiexec`` when the run needs MPI (the mpi backend or
``--compare raw`` with mpi4py installed), else as plain subprocesses.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from procgroup._launch.ports import PortReservation
from procgroup.errors import InvalidArgumentError

from ._options import Options
from ._rank import LAUNCHER_ENV, SHARED_DIR_ENV

log = logging.getLogger(__name__)

#: (rank variable, size variable) pairs that mean "a launcher started this process".
LAUNCHER_VARS = (
    ("RANK", "WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
)

#: Seconds the surviving ranks get to report their own error after one rank failed.
FAILURE_GRACE = 30.0


def external_launcher() -> str | None:
    """Which launcher variables are set ("RANK/WORLD_SIZE", ...), or None."""
    for rank_var, size_var in LAUNCHER_VARS:
        if os.environ.get(rank_var, "").strip() and os.environ.get(size_var, "").strip():
            return f"{rank_var}/{size_var}"
    return None


def mpiexec_path() -> str | None:
    """mpiexec next to this interpreter (the mpich wheel puts it there), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


def needs_mpiexec(opts: Options) -> bool:
    """True when the run must start under mpiexec; raises when it must and cannot."""
    wants_backend = "mpi" in opts.backends
    wants_raw = "raw" in opts.compare and importlib.util.find_spec("mpi4py") is not None
    if not (wants_backend or wants_raw):
        return False
    if mpiexec_path() is None:
        if wants_backend:
            raise InvalidArgumentError(
                "--backend mpi needs mpiexec, which was not found: pip install 'procgroup-mpi[mpich]'"
            )
        return False  # raw-mpi4py will be skipped with a note
    return True


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the spawner dies, so no rank outlives a killed run.

    The ranks also get a session of their own, so Ctrl-C reaches only the spawner, which
    then stops them cleanly (no traceback per rank).
    """
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn_job(opts: Options, argv: list[str]) -> int:
    """Start the ranks of this run on this host, wait (bounded by --job-timeout), return status."""
    use_mpi = needs_mpiexec(opts)
    holder = PortReservation("127.0.0.1")  # procgroup-run's: held all job, no bind race
    port = holder.port
    tmp = tempfile.mkdtemp(prefix="procgroup-bench-")
    how = f"procgroup-bench -np {opts.nprocs} ({'mpiexec' if use_mpi else 'subprocesses'}, env:// on loopback)"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               **{SHARED_DIR_ENV: opts.shared_dir or tmp, LAUNCHER_ENV: how})
    cmd = [sys.executable, "-m", "procgroup.bench", *argv]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if use_mpi:
            mpiexec = mpiexec_path()
            assert mpiexec is not None
            procs.append(subprocess.Popen([mpiexec, "-n", str(opts.nprocs), *cmd], env=env,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          preexec_fn=_die_with_parent))  # noqa: PLW1509 - no threads here
        else:
            for r in range(opts.nprocs):
                renv = dict(env, RANK=str(r), WORLD_SIZE=str(opts.nprocs), LOCAL_RANK=str(r),
                            LOCAL_WORLD_SIZE=str(opts.nprocs))
                procs.append(subprocess.Popen(cmd, env=renv, stdin=subprocess.DEVNULL, start_new_session=True,
                                              preexec_fn=_die_with_parent))  # noqa: PLW1509 - no threads here
        return _wait(procs, opts.job_timeout)
    except KeyboardInterrupt:
        print("procgroup-bench: interrupted; stopping the ranks", file=sys.stderr)
        _stop(procs)
        return 130
    finally:
        _stop(procs)
        holder.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _wait(procs: list[subprocess.Popen[bytes]], job_timeout: float) -> int:
    deadline = time.monotonic() + job_timeout
    failed_at: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            bad = [c for c in codes if c]
            return bad[0] if bad else 0
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now
        if failed_at is not None and now - failed_at > FAILURE_GRACE:
            ranks = [r for r, c in enumerate(codes) if c is None]
            print(f"procgroup-bench: a rank failed; stopping ranks {ranks} that are still running",
                  file=sys.stderr)
            _stop(procs)
            return next(c for c in codes if c)
        if now > deadline:
            print(f"procgroup-bench: the job ran past --job-timeout ({job_timeout:g} s); stopping it",
                  file=sys.stderr)
            _stop(procs)
            return 124
        time.sleep(0.1)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM the ranks still running, then SIGKILL what is left after 5 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
