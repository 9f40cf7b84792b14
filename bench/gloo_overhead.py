"""procgroup's gloo backend vs its raw engine on the same gloo context: what procgroup adds.

Run from the repository root with the dev venv (re-launches itself as 2 ranks through
procgroup-run when started plainly)::

    .venv/bin/python bench/gloo_overhead.py [--rounds 15] [--small-iters 300]
    .venv313/bin/python bench/gloo_overhead.py --engine torch

Both contenders run in one job, on one gloo context (the channel's own), interleaved
round by round so machine noise hits them alike: the raw engine call (``pygloo.allreduce``
on the array's pointer, or ``ProcessGroupGloo.allreduce`` on a tensor over it, then
``wait()``), and ``procgroup.all_reduce`` (the core's checks + the backend). Sizes
8 B, 4 MiB and 64 MiB of float32, with the channel's all_reduce algorithm (ring unless
$PROCGROUP_GLOO_ALGORITHM says bcube). Rank 0 prints medians over rounds and
procgroup's speed relative to raw pygloo (1.00 = same; the goal is >= 0.95) as Markdown.
bench/gloo_compare.py compares against torch.distributed's gloo, which needs separate jobs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from _interleave import interleaved_medians  # bench/ is sys.path[0] for a script run from it

SIZES = ((8, "8 B"), (4 * 2**20, "4 MiB"), (64 * 2**20, "64 MiB"))


def _relaunch(argv: list[str]) -> int:
    cmd = [sys.executable, "-m", "procgroup.run", "--nproc-per-node", "2", "--no-prefix",
           os.path.abspath(__file__), *argv]
    return subprocess.call(cmd)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="rounds per size (median over rounds)")
    parser.add_argument("--small-iters", type=int, default=300, help="calls per round at 8 B")
    parser.add_argument("--large-iters", type=int, default=3, help="calls per round at 4 and 64 MiB")
    parser.add_argument("--engine", choices=("pygloo", "torch"), default="pygloo", help="the gloo engine")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        sys.exit(_relaunch(argv))

    import numpy as np
    import procgroup as pg

    pg.init_process_group("gloo", options={"engine": args.engine})
    channel = pg.group_channel()
    engine = channel._engine  # the channel's own gloo context: same transport for both
    raw = _raw_pygloo(engine) if args.engine == "pygloo" else _raw_torch(engine)
    algorithm = channel._algorithm  # the one procgroup uses ($PROCGROUP_GLOO_ALGORITHM)

    def ours(a: np.ndarray) -> None:
        pg.all_reduce(a)

    raw_name = f"raw {args.engine}"
    variants: dict[str, Callable[[np.ndarray], None]] = {raw_name: raw, "procgroup gloo": ours}
    rows = []
    for nbytes, label in SIZES:
        a = np.zeros(nbytes // 4, dtype=np.float32)  # zeros: sums stay zeros, no overflow
        iters = args.small_iters if nbytes <= 8 else args.large_iters
        rows.append((label, nbytes, interleaved_medians(variants, a, rounds=args.rounds, iters=iters,
                                                        barrier=pg.barrier)))
    if pg.get_rank() == 0:
        from importlib import metadata

        print(f"# all_reduce SUM float32, 2 ranks, one gloo context, engine {args.engine} "
              f"{metadata.version(args.engine)}, {algorithm}, arrival check "
              f"{'on' if channel._check_arrival else 'off'}; median of {args.rounds} rounds")
        print(f"| size | {raw_name} | procgroup gloo | procgroup / raw speed |")
        print("|---|---|---|---|")
        for label, nbytes, med in rows:
            def fmt(s: float, small: bool = nbytes <= 8) -> str:
                return f"{s * 1e6:.1f} us" if small else f"{s * 1e3:.2f} ms"
            print(f"| {label} | {fmt(med[raw_name])} | {fmt(med['procgroup gloo'])} | "
                  f"{med[raw_name] / med['procgroup gloo']:.2f}x |")
    pg.destroy_process_group()


def _raw_pygloo(engine: Any) -> Callable[[Any], None]:
    import pygloo

    context, algorithm = engine.context, engine.algorithm
    f32 = pygloo.glooDataType_t.glooFloat32

    def raw(a: Any) -> None:
        p = a.ctypes.data
        pygloo.allreduce(context, p, p, a.size, f32, pygloo.ReduceOp.SUM, algorithm)

    return raw


def _raw_torch(engine: Any) -> Callable[[Any], None]:
    import torch
    import torch.distributed as dist

    group = engine._group  # the channel's own ProcessGroupGloo
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM

    def raw(a: Any) -> None:
        group.allreduce([torch.from_numpy(a)], opts).wait()

    return raw


if __name__ == "__main__":
    main(sys.argv[1:])
