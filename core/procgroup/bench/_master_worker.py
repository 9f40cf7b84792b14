"""``procgroup-bench master-worker``: master-worker mode against torch.distributed.rpc.

Each measurement starts its own processes on this host: 1 master + 1 worker for the
round trip, the async throughput and the large get; 1 master + 2 workers for the copy
between workers; 2 ranks for the backend's plain send/recv of the same size (the
yardstick of the copy). The copy's job also times that send/recv between its two
workers (``remote.run`` on each end, timed on the sender), alternated with the copies,
so that both meet the same moment of a noisy machine. With ``--compare torch`` the same measurements run on
torch.distributed.rpc (TensorPipe) in the same run. Medians of ``--reps`` timed
repetitions after a warm-up; a table on stdout, optional ``--json``.

What is measured (issue 16):

- round trip: ``(x + 1).get()`` on 8 float32 vs ``rpc_sync(w, torch.add, (t, 1))``;
- async: N in-place ``x += 1`` then one get, vs N ``rpc_async`` of an in-place add on an
  RRef's tensor + ``wait_all``; whether the final value is exact is reported too;
- large get: ``x.get()`` vs ``rref.to_here()``;
- worker to worker: ``x.to(1)`` (and a sync) vs torch: worker 1 ``rpc_sync(worker 2, f, (t,))``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from procgroup.errors import InvalidArgumentError

from ._launch import mpiexec_path
from ._sweep import format_size, parse_size

ROLES_ENV = "PROCGROUP_BENCH_MW_ROLE"


# --------------------------------------------------------------------- procgroup's side
def _median(fn: Callable[[], float], reps: int) -> float:
    fn()  # warm-up
    return statistics.median(fn() for _ in range(reps))


def role_master_worker(a: argparse.Namespace) -> dict[str, Any]:
    """The master's measurements (the workers never return from init_master_worker)."""
    import procgroup as pg

    pg.init_master_worker(a.backend, timeout=a.timeout)
    remote = pg.remote
    out: dict[str, Any] = {}
    x = remote.zeros(8, dtype=np.float32)

    def round_trip() -> float:
        t = time.perf_counter()
        for _ in range(a.round_trips):
            (x + 1).get()
        return (time.perf_counter() - t) / a.round_trips

    out["round_trip_s"] = _median(round_trip, a.reps)
    exact: list[bool] = []

    def async_ops() -> float:
        w = remote.zeros(8, dtype=np.float32)
        t = time.perf_counter()
        for _ in range(a.async_ops):
            w += 1
        got = w.get()
        dt = time.perf_counter() - t
        exact.append(bool((got == a.async_ops).all()))
        return dt

    out["async_ops_per_s"] = a.async_ops / _median(async_ops, a.reps)
    out["async_exact"] = all(exact)
    big = remote.ones(a.size // 4, dtype=np.float32)

    def get() -> float:
        t = time.perf_counter()
        big.get()
        return time.perf_counter() - t

    out["get_GBps"] = a.size / _median(get, a.reps) / 1e9
    if pg.num_nodes() >= 2:
        def to() -> float:
            pg.synchronize(0)
            t = time.perf_counter()
            moved = big.to(1)
            pg.synchronize(1)  # the copy is done once node 1 ran its receive
            dt = time.perf_counter() - t
            del moved
            return dt

        def between_workers() -> float:
            taken = remote.run_async(_yard_recv, a.size, 1, node=1)
            dt = remote.run(_yard_send, a.size, 2, node=0).get()
            taken.get()
            return float(dt)

        # alternated, so that both see the same moment of a noisy machine
        to_times, yard_times = [], []
        to(), between_workers()  # warm-up
        for _ in range(a.reps):
            to_times.append(to())
            yard_times.append(between_workers())
        out["to_GBps"] = a.size / statistics.median(to_times) / 1e9
        out["workers_sendrecv_GBps"] = a.size / statistics.median(yard_times) / 1e9
    pg.destroy_process_group()
    return out


#: user tags of the in-job yardstick (master-worker traffic uses 2**30 and up)
_YARD_TAG = 7000
_yard_buffers: dict[int, np.ndarray] = {}


def _yard_buffer(nbytes: int) -> np.ndarray:
    buf = _yard_buffers.get(nbytes)
    if buf is None:
        buf = _yard_buffers[nbytes] = np.ones(nbytes, np.uint8)
    return buf


def _yard_send(nbytes: int, peer: int) -> float:
    """On a worker (remote.run): the backend's own send of ``nbytes`` to world rank
    ``peer`` once its receive is posted, and the 1-byte ack back, timed here."""
    import procgroup as pg

    buf, flag = _yard_buffer(nbytes), np.zeros(1, np.uint8)
    pg.recv(flag, peer, tag=_YARD_TAG)  # the receive is posted
    t = time.perf_counter()
    pg.send(buf, peer, tag=_YARD_TAG + 1)
    pg.recv(flag, peer, tag=_YARD_TAG + 2)
    return time.perf_counter() - t


def _yard_recv(nbytes: int, peer: int) -> None:
    """The other end of :func:`_yard_send`: post the receive, say so, take it, ack."""
    import procgroup as pg

    buf, flag = _yard_buffer(nbytes), np.zeros(1, np.uint8)
    work = pg.irecv(buf, peer, tag=_YARD_TAG + 1)
    assert work is not None  # None only for a rank outside the group; the world holds every rank
    pg.send(flag, peer, tag=_YARD_TAG)
    work.wait()
    pg.send(flag, peer, tag=_YARD_TAG + 2)


def role_sendrecv(a: argparse.Namespace) -> dict[str, Any]:
    """The yardstick of ``.to()``: the backend's send + a 1-byte ack, reused buffers."""
    import procgroup as pg

    pg.init_process_group(a.backend, None if a.backend == "mpi" else "env://", timeout=a.timeout)
    buf = np.ones(a.size, np.uint8)
    ack = np.zeros(1, np.uint8)
    rank = pg.get_rank()

    def once() -> float:
        pg.barrier()
        t = time.perf_counter()
        if rank == 0:
            pg.send(buf, 1)
            pg.recv(ack, 1)
        else:
            pg.recv(buf, 0)
            pg.send(ack, 0)
        return time.perf_counter() - t

    dt = _median(once, a.reps)
    pg.destroy_process_group()
    return {"sendrecv_GBps": a.size / dt / 1e9} if rank == 0 else {}


# --------------------------------------------------------------------- torch rpc's side
def _t_make(n: int) -> Any:
    import torch

    return torch.zeros(n, dtype=torch.float32)


def _t_add_(rref: Any) -> None:
    rref.local_value().add_(1)


def _t_sink(t: Any) -> int:
    return int(t.numel())


def _t_push(dst: str, n: int, reps: int) -> float:
    """On worker 1: send an n-float tensor to ``dst`` by rpc_sync; the median time."""
    import torch
    from torch.distributed import rpc

    t = torch.ones(n, dtype=torch.float32)

    def once() -> float:
        s = time.perf_counter()
        rpc.rpc_sync(dst, _t_sink, (t,))
        return time.perf_counter() - s

    return _median(once, reps)


def role_torch(a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.distributed import rpc

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=a.timeout)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    out: dict[str, Any] = {}
    if rank == 0:
        t = torch.zeros(8, dtype=torch.float32)

        def round_trip() -> float:
            s = time.perf_counter()
            for _ in range(a.round_trips):
                rpc.rpc_sync("w1", torch.add, (t, 1))
            return (time.perf_counter() - s) / a.round_trips

        out["round_trip_s"] = _median(round_trip, a.reps)
        exact: list[bool] = []

        def async_ops() -> float:
            rref = rpc.remote("w1", _t_make, (8,))
            rref.to_here()
            s = time.perf_counter()
            futs = [rpc.rpc_async("w1", _t_add_, (rref,)) for _ in range(a.async_ops)]
            torch.futures.wait_all(futs)
            got = rref.to_here()
            dt = time.perf_counter() - s
            exact.append(bool((got == a.async_ops).all()))
            return dt

        out["async_ops_per_s"] = a.async_ops / _median(async_ops, a.reps)
        out["async_exact"] = all(exact)
        big = rpc.remote("w1", _t_make, (a.size // 4,))
        big.to_here()

        def get() -> float:
            s = time.perf_counter()
            big.to_here()
            return time.perf_counter() - s

        out["get_GBps"] = a.size / _median(get, a.reps) / 1e9
        if world >= 3:
            out["to_GBps"] = a.size / rpc.rpc_sync("w1", _t_push, ("w2", a.size // 4, a.reps)) / 1e9
    rpc.shutdown()
    return out


ROLES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "master-worker": role_master_worker, "sendrecv": role_sendrecv, "torch": role_torch,
}


# --------------------------------------------------------------------- the driver
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(role: str, world: int, a: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Run ``role`` on ``world`` new processes of this host; rank 0's result."""
    cmd = [sys.executable, "-m", "procgroup.bench._master_worker", *argv]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), PYTHONUNBUFFERED="1")
    env[ROLES_ENV] = role
    procs: list[subprocess.Popen[str]] = []
    if role != "torch" and a.backend == "mpi":
        mpiexec = mpiexec_path()
        if mpiexec is None:
            raise InvalidArgumentError("--backend mpi needs mpiexec, which was not found: pip install 'procgroup-mpi[mpich]'")
        procs.append(subprocess.Popen([mpiexec, "-n", str(world), *cmd], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL))
    else:
        for rank in range(world):
            renv = dict(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen(cmd, env=renv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          stdin=subprocess.DEVNULL))
    try:
        outs = [p.communicate(timeout=a.job_timeout) for p in procs]
    except subprocess.TimeoutExpired:
        raise InvalidArgumentError(f"{role}: the job did not finish within --job-timeout {a.job_timeout:g}s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (so, se) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{role} on {world} processes: a rank exited with {p.returncode}:\n{so[-2000:]}\n"
                               f"{se[-3000:]}")
    for so, _ in outs:
        for line in so.splitlines():
            if line.startswith("RESULT "):
                result: dict[str, Any] = json.loads(line[7:])
                return result
    raise RuntimeError(f"{role}: no result:\n{outs[0][0][-2000:]}\n{outs[0][1][-2000:]}")


def _rows(size: int) -> list[tuple[str, str, Callable[[Any], str], bool | None]]:
    """(label, key, format, lower is better; None: no ratio)."""
    big = format_size(size)
    return [
        ("round trip (x+1).get(), 8 float32", "round_trip_s", lambda v: f"{v * 1e6:.0f} us", True),
        ("async in-place ops / s (then one get)", "async_ops_per_s", lambda v: f"{v:,.0f}", False),
        ("  exact final value", "async_exact", str, None),
        (f"{big} get (worker -> master)", "get_GBps", lambda v: f"{v:.2f} GB/s", False),
        (f"{big} worker -> worker (.to)", "to_GBps", lambda v: f"{v:.2f} GB/s", False),
        (f"{big} send/recv, 2-rank job", "sendrecv_GBps", lambda v: f"{v:.2f} GB/s", None),
        (f"{big} send/recv, the same 2 workers", "workers_sendrecv_GBps", lambda v: f"{v:.2f} GB/s", None),
    ]


def table(result: dict[str, Any]) -> str:
    """The side-by-side table (ratio: how many times better procgroup is)."""
    p, t = result["procgroup"], result.get("torch") or {}
    torch_label = f"torch {result['versions']['torch']} rpc" if t else "torch rpc"
    title = (f"# procgroup-bench master-worker: backend {result['backend']}, 1 master + 1 worker "
             f"(+1 worker for .to), medians of {result['reps']}")
    lines = [title, f"{'measure':44} {'procgroup':>14} {torch_label:>18} {'ratio':>7}"]
    for label, key, fmt, lower_better in _rows(result["size"]):
        pv, tv = p.get(key), t.get(key)
        ratio = ""
        if isinstance(pv, float) and isinstance(tv, float) and lower_better is not None and pv and tv:
            ratio = f"{(tv / pv if lower_better else pv / tv):.2f}x"
        lines.append(f"{label:44} {fmt(pv) if pv is not None else '-':>14} "
                     f"{fmt(tv) if tv is not None else '-':>18} {ratio:>7}")
    to, sr, wsr = p.get("to_GBps"), p.get("sendrecv_GBps"), p.get("workers_sendrecv_GBps")
    if isinstance(to, float) and isinstance(sr, float) and sr:
        lines.append(f"# .to() moves at {to / sr:.2f}x the speed of the backend's own send/recv in a 2-rank job")
    if isinstance(to, float) and isinstance(wsr, float) and wsr:
        lines.append(f"# .to() moves at {to / wsr:.2f}x the speed of a send/recv between the same two workers, "
                     f"alternated with it in one job")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="procgroup-bench master-worker",
                                 description="Master-worker mode against torch.distributed.rpc, side by side.")
    ap.add_argument("--backend", "-B", default="tcp", help="procgroup backend (default tcp)")
    ap.add_argument("--compare", choices=["torch"], action="append", default=[],
                    help="also measure torch.distributed.rpc (TensorPipe) in the same run")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per measure (default 5)")
    ap.add_argument("--size", default="64M", help="size of the large get and copy (default 64M)")
    ap.add_argument("--async-ops", type=int, default=10_000, help="in-place ops before the sync (default 10000)")
    ap.add_argument("--round-trips", type=int, default=2000, help="round trips per repetition (default 2000)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds any one blocking call may take")
    ap.add_argument("--job-timeout", type=float, default=900.0, help="seconds each spawned job may take")
    ap.add_argument("--json", default=None, metavar="FILE", help="write the results and versions as JSON")
    return ap


def parse(argv: Sequence[str]) -> argparse.Namespace:
    a = build_parser().parse_args(list(argv))
    a.size = parse_size(a.size)
    for name in ("reps", "async_ops", "round_trips"):
        if getattr(a, name) < 1:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be at least 1")
    if a.size < 8 or a.size % 4:
        raise InvalidArgumentError("--size must be a multiple of 4 bytes, at least 8")
    return a


def main(argv: Sequence[str]) -> int:
    """Run every measure (each in its own job) and print the table."""
    a = parse(argv)
    import procgroup as pg

    result: dict[str, Any] = {
        "tool": "procgroup-bench master-worker", "backend": a.backend, "reps": a.reps, "size": a.size,
        "async_ops": a.async_ops, "host": socket.gethostname(), "cpus": os.cpu_count(),
        "versions": {"procgroup": pg.__version__, "numpy": np.__version__, "python": platform.python_version()},
    }
    p = _launch("master-worker", 2, a, argv)
    p.update({k: v for k, v in _launch("master-worker", 3, a, argv).items()
              if k in ("to_GBps", "workers_sendrecv_GBps")})
    p.update(_launch("sendrecv", 2, a, argv))
    result["procgroup"] = p
    if "torch" in a.compare:
        try:
            import torch
        except ImportError:
            print("procgroup-bench: note: --compare torch: torch is not importable here; procgroup's side only",
                  file=sys.stderr)
        else:
            result["versions"]["torch"] = str(torch.__version__)
            t = _launch("torch", 2, a, argv)
            t.update({k: v for k, v in _launch("torch", 3, a, argv).items() if k == "to_GBps"})
            result["torch"] = t
    print(table(result))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


def _rank_main() -> None:
    """One process of a spawned job: run its role, rank 0 prints the result."""
    a = parse(sys.argv[1:])
    result = ROLES[os.environ[ROLES_ENV]](a)
    if result:  # the master (rank 0) has one; master-worker workers never return
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    _rank_main()
