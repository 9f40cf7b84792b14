"""procgroup's mpi backend vs raw mpi4py: all_reduce latency (8 B) and bandwidth (64 MiB).

Run with 2 ranks (re-launches itself under mpiexec when started plainly)::

    python bench/mpi_overhead.py [--small-iters 20000] [--rounds 7] [--large-samples 21]

Both sides run in the same job, interleaved round by round so machine noise hits them
alike: raw ``comm.Allreduce(MPI.IN_PLACE, a)``, raw ``Iallreduce`` + ``Test`` polling
(the strategy procgroup uses so that calls can time out), the channel's blocking
all_reduce (``channel.blocking("all_reduce")``, the backend alone: ``do_all_reduce``),
the channel's started form waited on (``channel.start("all_reduce", ...).wait()``: what
every other blocking op and ``async_op=True`` run) and ``procgroup.all_reduce`` (public
API: the core's validation + the channel). Rank 0 prints medians and ratios as a
Markdown table (ratio = procgroup time / raw time; bandwidth ratio = raw time /
procgroup time).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable

from _interleave import interleaved_medians  # bench/ is sys.path[0] for a script run from it


def _under_mpiexec() -> bool:
    return any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


def _relaunch(argv: list[str]) -> int:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else "mpiexec"
    return subprocess.call([exe, "-n", "2", sys.executable, os.path.abspath(__file__), *argv])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small-iters", type=int, default=20000, help="calls per round at 8 B")
    parser.add_argument("--rounds", type=int, default=7, help="rounds at 8 B (median over rounds)")
    parser.add_argument("--large-samples", type=int, default=21, help="timed calls at 64 MiB per variant")
    args = parser.parse_args(argv)
    if not _under_mpiexec():
        sys.exit(_relaunch(argv))

    import numpy as np
    import procgroup as pg
    from mpi4py import MPI

    pg.init_process_group("mpi", timeout=120)
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()

    def raw(a: np.ndarray) -> None:
        comm.Allreduce(MPI.IN_PLACE, a)

    def raw_poll(a: np.ndarray) -> None:
        req = comm.Iallreduce(MPI.IN_PLACE, a)
        while not req.Test():
            pass

    def ours(a: np.ndarray) -> None:
        pg.all_reduce(a)

    channel = pg.group_channel()
    channel_all_reduce = channel.blocking("all_reduce")  # what the core's fast path calls
    SUM = pg.ReduceOp.SUM

    def backend(a: np.ndarray) -> None:
        channel_all_reduce(a, SUM)

    def started(a: np.ndarray) -> None:
        channel.start("all_reduce", a, SUM).wait()

    variants: dict[str, Callable[[np.ndarray], None]] = {
        "raw": raw, "raw_poll": raw_poll, "backend": backend, "start_wait": started, "procgroup": ours,
    }
    rows = []
    # latency: 8 bytes (one float64), many calls per round, median of per-round means
    small = np.ones(1, dtype=np.float64)
    rows.append(("8 B", interleaved_medians(variants, small, rounds=args.rounds, iters=args.small_iters,
                                            barrier=comm.Barrier, warmup=1000)))
    # bandwidth: 64 MiB of float32, one call per sample, median of samples
    large = np.ones(64 * 2**20 // 4, dtype=np.float32)
    rows.append(("64 MiB", interleaved_medians(variants, large, rounds=args.large_samples, iters=1,
                                               barrier=comm.Barrier)))
    if rank == 0:
        print(f"# all_reduce SUM, 2 ranks, {MPI.Get_library_version().splitlines()[0].strip()}, mpi4py "
              f"{__import__('mpi4py').__version__}")
        print("| size | raw mpi4py Allreduce | raw Iallreduce+Test | channel blocking all_reduce "
              "| channel start+wait | procgroup.all_reduce | channel/raw time | procgroup/raw time "
              "| procgroup/raw bandwidth |")
        print("|---|---|---|---|---|---|---|---|---|")
        for label, med in rows:
            nbytes = 8 if label == "8 B" else 64 * 2**20

            def fmt(s: float, small: bool = label == "8 B") -> str:
                return f"{s * 1e6:.2f} us" if small else f"{s * 1e3:.2f} ms"

            def bw(s: float, nbytes: int = nbytes) -> float:
                return nbytes / s / 2**30
            print(f"| {label} | {fmt(med['raw'])} ({bw(med['raw']):.3g} GiB/s) | {fmt(med['raw_poll'])} | "
                  f"{fmt(med['backend'])} | {fmt(med['start_wait'])} | {fmt(med['procgroup'])} ({bw(med['procgroup']):.3g} GiB/s) | "
                  f"{med['backend'] / med['raw']:.2f}x | {med['procgroup'] / med['raw']:.2f}x | "
                  f"{med['raw'] / med['procgroup']:.2f}x |")
    comm.Free()
    pg.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
