"""Measures the crossover sizes of the tcp backend's socket-path algorithms.

For each size it runs every candidate algorithm of an op on the world channel (over
the sockets: PROCGROUP_TCP_SHM=0 is set), interleaved in rounds so they share the
machine's load, and prints the median time per call of each, the slowest rank's.
The thresholds in ``procgroup_tcp/_collectives.py`` are where the winner changes.
Run from the repository root::

    .venv/bin/python bench/socket_thresholds.py --ranks 2 --op all_reduce
    .venv/bin/python bench/socket_thresholds.py --ranks 4 --op broadcast --sizes 64K,256K,1M,4M

It re-launches itself as ``--ranks`` ranks with procgroup-run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _candidates(op: str, ch: object, arr: object, seg_sizes: list[int]) -> dict[str, Callable[[], None]]:
    import procgroup as pg
    from procgroup.algorithms import ring, tree
    from procgroup.algorithms import pipelined

    scratch = pipelined.Scratch(1 << 30)
    sum_ = pg.ReduceOp.SUM
    out: dict[str, Callable[[], None]] = {}
    if op == "all_reduce":
        out["recursive-doubling"] = lambda: ring.recursive_doubling_all_reduce(ch, arr, sum_, ch.next_collective_tag())
        out["ring (unsegmented)"] = lambda: ring.ring_all_reduce(ch, arr, sum_, ch.next_collective_tag())
        for seg in seg_sizes:

            def run(seg: int = seg) -> None:
                buf = scratch.get(pipelined.scratch_bytes("pipelined_ring_all_reduce", arr, ch.size))
                pipelined.pipelined_ring_all_reduce(ch, arr, sum_, ch.next_collective_tag(), buf, seg)

            out[f"pipelined ring, {seg >> 10} KiB segments"] = run
    elif op == "broadcast":
        out["binomial tree"] = lambda: tree.broadcast(ch, arr, 0, ch.next_collective_tag())
        for seg in seg_sizes:
            out[f"chain, {seg >> 10} KiB segments"] = lambda seg=seg: pipelined.pipelined_chain_broadcast(
                ch, arr, 0, ch.next_collective_tag(), seg
            )
    elif op == "reduce":
        out["binomial tree"] = lambda: tree.reduce(ch, arr, 0, sum_, ch.next_collective_tag())
        for seg in seg_sizes:

            def run_reduce(seg: int = seg) -> None:
                buf = scratch.get(arr.nbytes)
                pipelined.pipelined_chain_reduce(ch, arr, 0, sum_, ch.next_collective_tag(), buf, seg)

            out[f"chain, {seg >> 10} KiB segments"] = run_reduce
    else:
        raise SystemExit(f"--op {op}: choose one of all_reduce, broadcast, reduce")
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--op", default="all_reduce")
    parser.add_argument("--sizes", default="8K,32K,64K,128K,256K,512K,1M,4M")
    parser.add_argument("--segments", default="256K,512K,1M", help="segment sizes of the pipelined variants")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per variant per round (about)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        env = dict(os.environ, PROCGROUP_TCP_SHM="0")
        sys.exit(
            subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "procgroup.run",
                    "--nproc-per-node",
                    str(args.ranks),
                    "--no-prefix",
                    os.path.abspath(__file__),
                    *argv,
                ],
                env=env,
            )
        )

    import numpy as np
    import procgroup as pg

    pg.init_process_group("tcp")
    ch = pg.group_channel()
    rank = pg.get_rank()
    segs = [_parse_size(s) for s in args.segments.split(",")]
    for nbytes in [_parse_size(s) for s in args.sizes.split(",")]:
        arr = np.zeros(max(nbytes // 4, 1), dtype=np.float32)
        variants = _candidates(args.op, ch, arr, segs)
        for fn in variants.values():  # warm-up, and a first estimate of the cost
            fn()
        t0 = time.perf_counter()
        next(iter(variants.values()))()
        est = np.array([time.perf_counter() - t0])
        pg.all_reduce(est, op=pg.ReduceOp.MAX)
        iters = int(max(3, min(2000, args.budget / max(float(est[0]), 1e-6))))
        times: dict[str, list[float]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                pg.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                per = np.array([(time.perf_counter() - t0) / iters * 1e6])
                pg.all_reduce(per, op=pg.ReduceOp.MAX)
                times[name].append(float(per[0]))
        if rank == 0:
            best = min(times, key=lambda k: statistics.median(times[k]))
            for name, ts in times.items():
                mark = "  <- fastest" if name == best else ""
                print(
                    f"{args.op} {pg.get_world_size()} ranks {nbytes:>9} B  {name:<34} "
                    f"{statistics.median(ts):10.1f} us{mark}",
                    flush=True,
                )
    pg.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
