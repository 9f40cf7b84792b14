"""procgroup's nccl backend against raw CuPy NCCL on one GPU (scripts/gpu-check.sh runs it).

One process, a communicator of one rank on GPU 0 each way: procgroup's
``all_reduce``/``broadcast``/``all_gather`` on a CuPy array, and the same NCCL call made
directly on a ``cupy.cuda.nccl.NcclCommunicator``. Each timed call is followed by a
synchronize of the caller's stream (procgroup's blocking call orders that stream after
the op, as torch's does), so both sides time the op on the GPU plus its launch. The time
of a point is the median of its iterations; the two variants alternate per iteration.
What it shows on one GPU is procgroup's fixed cost per call over raw NCCL (with one rank
NCCL moves no data between GPUs); figures go to docs/backends/nccl.md, "GPU check".

    python scripts/gpu_bench_nccl.py [--min-bytes 1K] [--max-bytes 256M] [--iters 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def sizes(lo: int, hi: int) -> list[int]:
    out, n = [], max(4, lo)
    while n <= hi:
        out.append(n)
        n *= 4
    return out


def median_us(fn: Callable[[], None], sync: Callable[[], None], iters: int) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=parse_size, default=parse_size("1K"))
    parser.add_argument("--max-bytes", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--dry-run", action="store_true", help="parse, import procgroup, print the plan; no GPU")
    args = parser.parse_args(argv)
    plan = sizes(args.min_bytes, args.max_bytes)
    import procgroup as pg

    if args.dry_run:
        print(f"dry run: procgroup {pg.__version__}; sizes {plan[0]}..{plan[-1]} bytes ({len(plan)} points), "
              f"ops all_reduce, broadcast, all_gather, {args.iters} iterations each")
        return 0

    import cupy as cp
    from cupy.cuda import nccl

    cp.cuda.Device(0).use()
    with tempfile.TemporaryDirectory() as tmp:
        pg.init_process_group("nccl", init_method=f"file://{tmp}/rendezvous", world_size=1, rank=0)
        raw = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        stream = cp.cuda.get_current_stream()
        f32, s = nccl.NCCL_FLOAT32, nccl.NCCL_SUM
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        print(f"# GPU 0: {name}; CuPy {cp.__version__}; NCCL {nccl.get_version()}; procgroup {pg.__version__}; "
              f"Python {sys.version.split()[0]}")
        print(f"# median of {args.iters} iterations, each call then a stream synchronize; one rank")
        print(f"{'op':<11}{'bytes':>12}{'raw NCCL us':>14}{'procgroup us':>14}{'ratio':>8}{'procgroup GB/s':>16}")
        for op in ("all_reduce", "broadcast", "all_gather"):
            for nbytes in plan:
                a = cp.ones(nbytes // 4, dtype=cp.float32)
                outs = [cp.empty_like(a)]
                raw_call, pg_call = _calls(op, raw, a, outs, stream, f32, s, pg)
                for _ in range(3):  # warm-up: communicators, kernels, plans
                    raw_call()
                    pg_call()
                stream.synchronize()
                t_raw = median_us(raw_call, stream.synchronize, args.iters)
                t_pg = median_us(pg_call, stream.synchronize, args.iters)
                print(f"{op:<11}{nbytes:>12}{t_raw:>14.1f}{t_pg:>14.1f}{t_pg / t_raw:>8.2f}"
                      f"{nbytes / t_pg / 1e3:>16.2f}", flush=True)
        raw.destroy()
        pg.destroy_process_group()
    return 0


def _calls(op: str, raw: Any, a: Any, outs: list[Any], stream: Any, f32: int, s: int,
           pg: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    n, ptr, sp = a.size, a.data.ptr, stream.ptr
    if op == "all_reduce":
        return (lambda: raw.allReduce(ptr, ptr, n, f32, s, sp)), (lambda: pg.all_reduce(a))
    if op == "broadcast":
        return (lambda: raw.bcast(ptr, n, f32, 0, sp)), (lambda: pg.broadcast(a, 0))
    out = outs[0]
    return (lambda: raw.allGather(ptr, out.data.ptr, n, f32, sp)), (lambda: pg.all_gather(outs, a))


if __name__ == "__main__":
    sys.exit(main())
