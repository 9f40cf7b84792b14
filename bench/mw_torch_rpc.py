"""Master-worker mode against torch.distributed.rpc (TensorPipe), side by side in one run.

    .venv-bench/bin/python bench/mw_torch_rpc.py [--json out.json] [--reps 5]

(.venv-bench: scripts/setup-bench-venv.sh; it holds procgroup, the tcp backend and torch.)
Each measurement starts its own processes on this host: 1 master + 1 worker for the
round trip, the async throughput and the 64 MiB get; 1 master + 2 workers for the 64 MiB
copy between workers; 2 ranks for procgroup's plain send/recv of 64 MiB. Medians of
``--reps`` timed repetitions (after a warm-up) are printed as a table and, with --json,
written out. Without torch only procgroup's side is measured.

What is measured (issue 16):
- round trip: procgroup ``(x + 1).get()`` on 8 float32 vs ``rpc_sync(w, torch.add, (t, 1))``;
- async: 10,000 in-place ``x += 1`` then one get, vs 10,000 ``rpc_async`` of an in-place
  add on an RRef's tensor + ``wait_all``; the final value is checked (exact or not);
- 64 MiB get: ``x.get()`` vs ``rref.to_here()``;
- 64 MiB worker -> worker: ``x.to(1)`` (and a sync) vs procgroup ``send``/``recv`` of 64 MiB
  between two ranks vs torch: worker 1 ``rpc_sync(worker 2, f, (tensor,))``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

MIB64 = 64 << 20
N_ASYNC = 10_000


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(role: str, world: int, reps: int) -> dict[str, Any]:
    port = _port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                   RANK=str(rank), PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--role", role, "--reps", str(reps)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (so, se) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{role}: a rank exited with {p.returncode}:\n{so[-2000:]}\n{se[-3000:]}")
    for line in outs[0][0].splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{role}: no result:\n{outs[0][0][-2000:]}\n{outs[0][1][-2000:]}")


def _median(fn: Any, reps: int) -> float:
    fn()  # warm-up
    return statistics.median(fn() for _ in range(reps))


# --------------------------------------------------------------------- procgroup
def role_pg_mw(reps: int) -> dict[str, Any]:
    import procgroup as pg

    pg.init_master_worker("tcp")
    R = pg.remote
    out: dict[str, Any] = {}
    x = R.zeros(8, dtype=np.float32)

    def rt() -> float:
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            (x + 1).get()
        return (time.perf_counter() - t) / n

    out["round_trip_s"] = _median(rt, reps)
    exact = []

    def async_ops() -> float:
        w = R.zeros(8, dtype=np.float32)
        t = time.perf_counter()
        for _ in range(N_ASYNC):
            w += 1
        got = w.get()
        dt = time.perf_counter() - t
        exact.append(bool((got == N_ASYNC).all()))
        return dt

    out["async_ops_per_s"] = N_ASYNC / _median(async_ops, reps)
    out["async_exact"] = all(exact)
    big = R.ones(MIB64 // 4, dtype=np.float32)

    def get() -> float:
        t = time.perf_counter()
        big.get()
        return time.perf_counter() - t

    out["get_64MiB_GBps"] = MIB64 / _median(get, reps) / 1e9
    if pg.num_nodes() >= 2:
        def to() -> float:
            pg.synchronize(0)
            t = time.perf_counter()
            moved = big.to(1)
            pg.synchronize(1)  # the copy is done once node 1 ran its receive
            dt = time.perf_counter() - t
            del moved
            return dt

        out["to_64MiB_GBps"] = MIB64 / _median(to, reps) / 1e9
    return out


def role_pg_sendrecv(reps: int) -> dict[str, Any]:
    import procgroup as pg

    pg.init_process_group("tcp")
    buf = np.ones(MIB64, np.uint8)
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

    dt = _median(once, reps)
    pg.destroy_process_group()
    return {"sendrecv_64MiB_GBps": MIB64 / dt / 1e9}


# --------------------------------------------------------------------- torch rpc
_REMOTE_T: Any = None


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


def role_torch(reps: int) -> dict[str, Any]:
    import torch
    from torch.distributed import rpc

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=600)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    out: dict[str, Any] = {}
    if rank == 0:
        t = torch.zeros(8, dtype=torch.float32)

        def rt() -> float:
            n = 2000
            s = time.perf_counter()
            for _ in range(n):
                rpc.rpc_sync("w1", torch.add, (t, 1))
            return (time.perf_counter() - s) / n

        out["round_trip_s"] = _median(rt, reps)
        exact = []

        def async_ops() -> float:
            rref = rpc.remote("w1", _t_make, (8,))
            rref.to_here()
            s = time.perf_counter()
            futs = [rpc.rpc_async("w1", _t_add_, (rref,)) for _ in range(N_ASYNC)]
            torch.futures.wait_all(futs)
            got = rref.to_here()
            dt = time.perf_counter() - s
            exact.append(bool((got == N_ASYNC).all()))
            return dt

        out["async_ops_per_s"] = N_ASYNC / _median(async_ops, reps)
        out["async_exact"] = all(exact)
        big = rpc.remote("w1", _t_make, (MIB64 // 4,))
        big.to_here()

        def get() -> float:
            s = time.perf_counter()
            big.to_here()
            return time.perf_counter() - s

        out["get_64MiB_GBps"] = MIB64 / _median(get, reps) / 1e9
        if world >= 3:
            dt = rpc.rpc_sync("w1", _t_push, ("w2", MIB64 // 4, reps))
            out["to_64MiB_GBps"] = MIB64 / dt / 1e9
    rpc.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.role:
        result = {"pg-mw": role_pg_mw, "pg-sendrecv": role_pg_sendrecv, "torch": role_torch}[a.role](a.reps)
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return
    res: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    res["procgroup"] = _launch("pg-mw", 2, a.reps)
    res["procgroup"].update({k: v for k, v in _launch("pg-mw", 3, a.reps).items() if k == "to_64MiB_GBps"})
    res["procgroup"].update(_launch("pg-sendrecv", 2, a.reps))
    try:
        import torch

        res["torch_version"] = torch.__version__
        res["torch"] = _launch("torch", 2, a.reps)
        res["torch"].update({k: v for k, v in _launch("torch", 3, a.reps).items() if k == "to_64MiB_GBps"})
    except ImportError:
        res["torch"] = None
    p, t = res["procgroup"], res["torch"] or {}
    rows = [("round trip (x+1).get(), 8 float32", "round_trip_s", lambda v: f"{v * 1e6:.0f} us", True),
            ("async in-place ops / s (10,000 then get)", "async_ops_per_s", lambda v: f"{v:,.0f}", False),
            ("  exact final value", "async_exact", str, None),
            ("64 MiB get (worker -> master)", "get_64MiB_GBps", lambda v: f"{v:.2f} GB/s", False),
            ("64 MiB worker -> worker", "to_64MiB_GBps", lambda v: f"{v:.2f} GB/s", False),
            ("procgroup send/recv 64 MiB", "sendrecv_64MiB_GBps", lambda v: f"{v:.2f} GB/s", False)]
    print(f"{'measure':44} {'procgroup':>14} {'torch rpc':>14} {'ratio':>7}")
    for label, key, fmt, lower_better in rows:
        pv, tv = p.get(key), t.get(key)
        ratio = ""
        if isinstance(pv, float) and isinstance(tv, float) and lower_better is not None:
            ratio = f"{(tv / pv if lower_better else pv / tv):.2f}x"
        print(f"{label:44} {fmt(pv) if pv is not None else '-':>14} {fmt(tv) if tv is not None else '-':>14} {ratio:>7}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
