"""Start N real ranks of a procgroup job and bring back each rank's result.

Two launchers: ``"process"`` (multiprocessing, spawn context, file:// rendezvous in a
temporary directory, so no port can race) and ``"mpiexec"`` (a real ``mpiexec -n N``
running :mod:`procgroup.testing._worker`). A worker's exception comes back as a
:class:`WorkerError` carrying the rank and its traceback; a rank that dies or hangs is
named too.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence


class WorkerError(AssertionError):
    """A rank raised or died; the message holds its rank and traceback."""


@dataclass
class JobSpec:
    """What every rank needs: which function to run and how to join the group."""

    fn: tuple[str, str]  # module, qualname
    args: tuple[Any, ...]
    backend: str
    world_size: int
    init_method: str | None
    timeout: float
    setup: tuple[str, str] | None = None  # called in each rank before init (register_backend, ...)
    env: dict[str, str] = field(default_factory=dict)
    init: bool = True


def _ref(fn: Callable[..., Any]) -> tuple[str, str]:
    return fn.__module__, fn.__qualname__


def _resolve(ref: tuple[str, str]) -> Callable[..., Any]:
    obj: Any = importlib.import_module(ref[0])
    for part in ref[1].split("."):
        obj = getattr(obj, part)
    return obj


def run_rank(job: JobSpec, rank: int) -> Any:
    """Body of one rank: optional setup, init, the function, teardown."""
    import procgroup as pg

    os.environ.update(job.env)
    if job.setup is not None:
        _resolve(job.setup)()
    if job.init:
        pg.init_process_group(job.backend, job.init_method, rank=rank if job.init_method else -1,
                              world_size=job.world_size if job.init_method else -1, timeout=job.timeout)
    try:
        return _resolve(job.fn)(rank, job.world_size, *job.args)
    finally:
        if job.init:
            pg.destroy_process_group()


def free_port() -> int:
    """A port that was free a moment ago (tests only: another process could take it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _process_main(job: JobSpec, rank: int, queue: Any) -> None:
    try:
        value = run_rank(job, rank)
        queue.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        queue.put((rank, False, traceback.format_exc()))


def spawn(fn: Callable[..., Any], world_size: int, backend: str = "tcp", *, args: Sequence[Any] = (),
          timeout: float = 30.0, job_timeout: float = 240.0, launcher: str = "process",
          init_method: str | None = "file", setup: Callable[[], None] | None = None,
          env: dict[str, str] | None = None, expect_dead: Sequence[int] = (), init: bool = True) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes; return their results.

    ``init_method="file"`` makes a fresh file:// URL, ``"tcp"`` a tcp:// URL on a free
    loopback port; any other URL is used as given; None lets the backend find its peers
    (mpi under mpiexec). Ranks in ``expect_dead`` may die without a result (None).
    """
    tmp = tempfile.mkdtemp(prefix="procgroup-job-")
    try:
        if init_method == "file":
            init_method = f"file://{tmp}/rendezvous"
        elif init_method == "tcp":
            init_method = f"tcp://127.0.0.1:{free_port()}"
        job = JobSpec(_ref(fn), tuple(args), backend, world_size, init_method, timeout,
                      _ref(setup) if setup else None, dict(env or {}), init)
        if launcher == "mpiexec":
            return _spawn_mpiexec(job, tmp, job_timeout, expect_dead)
        return _spawn_processes(job, job_timeout, expect_dead)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _spawn_processes(job: JobSpec, job_timeout: float, expect_dead: Sequence[int]) -> list[Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_process_main, args=(job, r, queue), daemon=True) for r in range(job.world_size)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + job_timeout
    try:
        while len(results) < job.world_size:
            alive = [r for r, p in enumerate(procs) if r not in results and p.is_alive()]
            try:
                rank, ok, payload = queue.get(timeout=0.2)
                results[rank] = (ok, payload)
                continue
            except Exception:  # noqa: BLE001 - queue.Empty
                pass
            gone = [r for r, p in enumerate(procs) if r not in results and not p.is_alive()]
            if gone and queue.empty():
                time.sleep(0.2)  # a result may still be in the pipe
                if queue.empty():
                    dead = [r for r in gone if r not in expect_dead]
                    if dead:
                        raise WorkerError(
                            f"rank(s) {dead} died without a result (exit codes "
                            f"{[procs[r].exitcode for r in dead]})" + _errors_so_far(results))
                    for r in gone:
                        results[r] = (True, pickle.dumps(None))
            if time.monotonic() > deadline:
                raise WorkerError(f"job timed out after {job_timeout}s; ranks {alive} never reported"
                                  + _errors_so_far(results))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return _unpack(results, job.world_size)


def _errors_so_far(results: dict[int, tuple[bool, Any]]) -> str:
    return "".join(f"\n--- rank {r} raised:\n{payload}" for r, (ok, payload) in sorted(results.items()) if not ok)


def _unpack(results: dict[int, tuple[bool, Any]], size: int) -> list[Any]:
    failed = [(r, payload) for r, (ok, payload) in sorted(results.items()) if not ok]
    if failed:
        raise WorkerError("".join(f"\n--- rank {r} raised:\n{tb}" for r, tb in failed))
    return [pickle.loads(results[r][1]) for r in range(size)]


def mpiexec_command() -> list[str]:
    """mpiexec next to this interpreter (the mpich wheel puts it there), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else shutil.which("mpiexec")
    if exe is None:
        raise FileNotFoundError("mpiexec not found: pip install mpich (or install an MPI)")
    return [exe]


def _text(output: bytes | str | None) -> str:
    """A TimeoutExpired's captured output as text (bytes there even with text=True)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _spawn_mpiexec(job: JobSpec, tmp: str, job_timeout: float, expect_dead: Sequence[int]) -> list[Any]:
    with open(os.path.join(tmp, "job.pkl"), "wb") as f:
        pickle.dump((job, sys.path), f)
    cmd = mpiexec_command() + ["-n", str(job.world_size), sys.executable, "-m", "procgroup.testing._worker", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=job_timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise WorkerError(f"mpiexec job timed out after {job_timeout}s:\n{_text(exc.stdout)}\n{_text(exc.stderr)}") from None
    results: dict[int, tuple[bool, Any]] = {}
    for r in range(job.world_size):
        path = os.path.join(tmp, f"result-{r}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                results[r] = pickle.load(f)
        elif r in expect_dead:
            results[r] = (True, pickle.dumps(None))
    missing = [r for r in range(job.world_size) if r not in results]
    if missing:
        raise WorkerError(f"ranks {missing} wrote no result (mpiexec exit {proc.returncode}):\n"
                          f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}" + _errors_so_far(results))
    return _unpack(results, job.world_size)
