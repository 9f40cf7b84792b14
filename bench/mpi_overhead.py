"""procgroup's mpi backend vs raw mpi4py: all_reduce latency (8 B) and bandwidth (64 MiB),
or (``--op sendrecv``) a send/recv ping-pong at 8 B, 4 MiB and 64 MiB, layer by layer.

Run with 2 ranks (re-launches itself under mpiexec when started plainly)::

    python bench/mpi_overhead.py [--op sendrecv] [--small-iters 20000] [--rounds 7] [--large-samples 21]

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
from typing import Any

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
    parser.add_argument("--op", choices=("all_reduce", "sendrecv"), default="all_reduce",
                        help="all_reduce, or a send/recv ping-pong (one-way time = round trip / 2)")
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
    if args.op == "sendrecv":
        _sendrecv(args, pg, comm, MPI, np)
        comm.Free()
        pg.destroy_process_group()
        return
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


def _sendrecv(args: argparse.Namespace, pg: Any, comm: Any, MPI: Any, np: Any) -> None:
    """Ping-pong between ranks 0 and 1: raw Send/Recv against procgroup's send/recv."""
    rank = comm.Get_rank()
    peer = 1 - rank
    channel = pg.group_channel()

    def pingpong(send: Callable[[Any], None], recv: Callable[[Any], None]) -> Callable[[Any], None]:
        if rank == 0:
            def run(a: Any) -> None:
                send(a)
                recv(a)
        else:
            def run(a: Any) -> None:
                recv(a)
                send(a)
        return run

    def isend_test(a: Any) -> None:
        req = comm.Isend(a, peer, 0)
        while not req.Test():
            pass

    def irecv_test(a: Any) -> None:
        status = MPI.Status()
        req = comm.Irecv(a, peer, 0)
        while not req.Test(status):
            pass

    send, recv = channel.blocking("send"), channel.blocking("recv")
    # the layers, bottom up: MPI's blocking calls; the nonblocking calls + a Test loop (what
    # the backend does, so that it can time out); the backend's blocking callables; the API
    variants: dict[str, Callable[[Any], None]] = {
        "raw": pingpong(lambda a: comm.Send(a, peer, 0), lambda a: comm.Recv(a, peer, 0)),
        "raw_test": pingpong(isend_test, irecv_test),
        "channel": pingpong(lambda a: send(a, peer, 0), lambda a: recv(a, peer, 0)),
        "procgroup": pingpong(lambda a: pg.send(a, peer), lambda a: pg.recv(a, peer)),
    }
    rows = []
    for nbytes, iters, rounds in ((8, args.small_iters // 2, args.rounds), (4 << 20, 20, args.rounds),
                                  (64 << 20, 1, args.large_samples)):
        a = np.ones(nbytes // 4, dtype=np.float32)
        med = interleaved_medians(variants, a, rounds=rounds, iters=iters, barrier=comm.Barrier,
                                  warmup=min(iters, 1000))
        rows.append((nbytes, {k: v / 2 for k, v in med.items()}))  # one way
    if rank == 0:
        print(f"# send/recv ping-pong, one-way time, 2 ranks, "
              f"{MPI.Get_library_version().splitlines()[0].strip()}, mpi4py {__import__('mpi4py').__version__}")
        print("| size | raw mpi4py Send/Recv | raw Isend/Irecv+Test | channel blocking send/recv "
              "| procgroup send/recv | channel/raw | procgroup/raw |")
        print("|---|---|---|---|---|---|---|")
        for nbytes, med in rows:
            label = "8 B" if nbytes == 8 else f"{nbytes >> 20} MiB"
            unit, scale = ("us", 1e6) if nbytes < 2**20 else ("ms", 1e3)
            print(f"| {label} | {med['raw'] * scale:.2f} {unit} | {med['raw_test'] * scale:.2f} {unit} | "
                  f"{med['channel'] * scale:.2f} {unit} | "
                  f"{med['procgroup'] * scale:.2f} {unit} | {med['channel'] / med['raw']:.2f}x | "
                  f"{med['procgroup'] / med['raw']:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
