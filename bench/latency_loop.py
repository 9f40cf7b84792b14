"""Back-to-back latency: a loop of small all_reduce calls (or a send/recv ping-pong, ``--op
pingpong``), the way an application issues them.

procgroup-bench times one call after a barrier, so for a few bytes its figure includes how
far apart the ranks leave that barrier. This script times ``--iters`` calls in a row
instead and divides, like OSU's osu_allreduce. Run from the repository root::

    .venv/bin/python bench/latency_loop.py [--backend tcp] [--nbytes 8] [--ranks 2]
    .venv-bench/bin/python bench/latency_loop.py --backend torch-gloo   # the baseline
    .venv313/bin/python bench/latency_loop.py --op pingpong --nbytes 8    # one way, rank 0 <-> 1

It re-launches itself as ``--ranks`` ranks (procgroup-run; mpiexec for the mpi backend)
and rank 0 prints the median and minimum over ``--rounds`` rounds, in microseconds. A ping-pong's figure is one way: half a round trip of ranks 0 and 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time


def _relaunch(args: argparse.Namespace, argv: list[str]) -> int:
    me = [sys.executable, os.path.abspath(__file__), *argv]
    if args.backend == "mpi":
        here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        mpiexec = here if os.path.exists(here) else shutil.which("mpiexec") or "mpiexec"
        return subprocess.call([mpiexec, "-n", str(args.ranks), *me])
    return subprocess.call([sys.executable, "-m", "procgroup.run", "--nproc-per-node", str(args.ranks),
                            "--no-prefix", *me[1:]])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="tcp")
    parser.add_argument("--op", choices=("all_reduce", "pingpong"), default="all_reduce")
    parser.add_argument("--nbytes", type=int, default=8, help="bytes per call (float32)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--iters", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args(argv)
    if not any(v in os.environ for v in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK")):
        sys.exit(_relaunch(args, argv))

    if args.backend == "torch-gloo":  # the baseline, from .venv-bench (torch has no 3.10 wheel here)
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        a = torch.zeros(max(args.nbytes // 4, 1), dtype=torch.float32)
        lib = dist
    else:
        import numpy as np
        import procgroup as pg

        pg.init_process_group(args.backend)
        a = np.zeros(max(args.nbytes // 4, 1), dtype=np.float32)
        lib = pg
    call, what = lambda: lib.all_reduce(a), "all_reduce"
    if args.op == "pingpong":
        rank, what = lib.get_rank(), "ping-pong one way"
        send, recv = lib.send, lib.recv

        def call() -> None:
            if rank == 0:
                send(a, 1)
                recv(a, 1)
            elif rank == 1:
                recv(a, 0)
                send(a, 0)

    for _ in range(min(args.iters, 200)):  # warm-up
        call()
    per_call = []
    for _ in range(args.rounds):
        lib.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            call()
        per_call.append((time.perf_counter() - t0) / args.iters * 1e6 / (2 if args.op == "pingpong" else 1))
    if lib.get_rank() == 0:
        print(f"{args.backend}: {lib.get_world_size()} ranks, {what} of {a.nbytes} B, "
              f"{args.iters} calls per round: median {statistics.median(per_call):.1f} us, "
              f"min {min(per_call):.1f} us ({args.rounds} rounds)")
    lib.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
