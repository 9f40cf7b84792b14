"""procgroup's mpi backend vs raw mpi4py, layer by layer, in one job: all_reduce, or
(``--op sendrecv``) a send/recv ping-pong, at 8 B, 4 MiB and 64 MiB (``--sizes``).

Run with 2 ranks (re-launches itself under mpiexec when started plainly)::

    python bench/mpi_overhead.py [--op sendrecv] [--sizes 8,4M,64M] [--small-iters 20000]
                                 [--rounds 7] [--large-samples 21]

Every contender runs in the same job, interleaved round by round so machine noise hits
them alike. The layers, bottom up:

- all_reduce: raw ``comm.Allreduce(MPI.IN_PLACE, a)``; raw ``Iallreduce`` + ``Test``
  polling (what the backend does so that a call can time out); the backend alone
  (``channel.do_all_reduce``); the channel's blocking callable
  (``channel.blocking("all_reduce")``: the backend and the flight recorder's entry); the
  started form waited on (``channel.start("all_reduce", ...).wait()``: what every other
  blocking op and ``async_op=True`` run); ``procgroup.all_reduce`` (public API).
- sendrecv: raw ``comm.Send``/``comm.Recv``; raw ``Isend``/``Irecv`` + a ``Test`` loop; the
  backend alone (``channel.do_send``/``do_recv``); the channel's blocking callables
  (``channel.blocking("send")``, recorded); ``procgroup.send``/``procgroup.recv``. The
  time is one way: half the round trip.

Rank 0 prints medians and ratios (contender time / raw time; the ratio columns use the
short names raw_test, backend, channel, start_wait, procgroup) as a Markdown table, with
the load average at the start and the end (the 8 B ratios swing with load).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from _interleave import interleaved_medians  # bench/ is sys.path[0] for a script run from it

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def _under_mpiexec() -> bool:
    return any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


def _relaunch(argv: list[str]) -> int:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else "mpiexec"
    return subprocess.call([exe, "-n", "2", sys.executable, os.path.abspath(__file__), *argv])


def _sizes(text: str) -> list[int]:
    """``8,4M,64M`` -> bytes (K, M, G are powers of 2; each a multiple of 8 bytes)."""
    sizes = []
    for item in text.split(","):
        item = item.strip().upper().removesuffix("B").removesuffix("I")
        unit = item[-1:] if item[-1:] in _UNITS else ""
        n = int(item[:len(item) - len(unit)]) * _UNITS[unit]
        if n <= 0 or n % 8:
            raise argparse.ArgumentTypeError(f"size {item!r}: a positive multiple of 8 bytes")
        sizes.append(n)
    return sizes


def _label(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _fmt(seconds: float, nbytes: int) -> str:
    return f"{seconds * 1e6:.2f} us" if nbytes < 2**20 else f"{seconds * 1e3:.2f} ms"


def _plan(nbytes: int, args: argparse.Namespace) -> tuple[int, int]:
    """(calls per round, rounds): many calls per round when small, one per sample when large."""
    if nbytes < 2**16:
        return args.small_iters, args.rounds
    if nbytes < 2**24:
        return 20, args.rounds
    return 1, args.large_samples


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("all_reduce", "sendrecv"), default="all_reduce",
                        help="all_reduce, or a send/recv ping-pong (one-way time = round trip / 2)")
    parser.add_argument("--sizes", type=_sizes, default=[8, 4 << 20, 64 << 20],
                        help="message sizes in bytes, comma separated, K/M/G suffixes (default 8,4M,64M)")
    parser.add_argument("--small-iters", type=int, default=20000, help="calls per round below 64 KiB")
    parser.add_argument("--rounds", type=int, default=7, help="rounds below 16 MiB (median over rounds)")
    parser.add_argument("--large-samples", type=int, default=21, help="timed calls from 16 MiB, per contender")
    args = parser.parse_args(argv)
    if not _under_mpiexec():
        sys.exit(_relaunch(argv))

    import numpy as np
    import procgroup as pg
    from mpi4py import MPI

    pg.init_process_group("mpi", timeout=120)
    comm = MPI.COMM_WORLD.Dup()
    load = os.getloadavg()[0]
    if args.op == "sendrecv":
        columns, rows = _sendrecv(args, pg, comm, MPI, np)
    else:
        columns, rows = _all_reduce(args, pg, comm, MPI, np)
    if comm.Get_rank() == 0:
        import mpi4py

        what = "send/recv ping-pong, one-way time" if args.op == "sendrecv" else "all_reduce SUM, float32"
        print(f"# {what}, 2 ranks, {MPI.Get_library_version().splitlines()[0].strip()}, mpi4py "
              f"{mpi4py.__version__}, Python {sys.version.split()[0]}, load average {load:.1f} at the start "
              f"and {os.getloadavg()[0]:.1f} at the end")
        names = list(columns)
        print("| size | " + " | ".join(columns.values()) + " | "
              + " | ".join(f"{n} / raw" for n in names[1:]) + " |")
        print("|---" * (1 + 2 * len(names) - 1) + "|")
        for nbytes, med in rows:
            times = [_fmt(med[n], nbytes) for n in names]
            ratios = [f"{med[n] / med['raw']:.2f}x" for n in names[1:]]
            print(f"| {_label(nbytes)} | " + " | ".join(times) + " | " + " | ".join(ratios) + " |")
    comm.Free()
    pg.destroy_process_group()


def _all_reduce(args: argparse.Namespace, pg: Any, comm: Any, MPI: Any,
                np: Any) -> tuple[dict[str, str], list[tuple[int, dict[str, float]]]]:
    channel = pg.group_channel()
    do_all_reduce = channel.do_all_reduce
    blocking = channel.blocking("all_reduce")
    SUM = pg.ReduceOp.SUM

    def raw_poll(a: Any) -> None:
        req = comm.Iallreduce(MPI.IN_PLACE, a)
        while not req.Test():
            pass

    variants: dict[str, Callable[[Any], None]] = {
        "raw": lambda a: comm.Allreduce(MPI.IN_PLACE, a),
        "raw_test": raw_poll,
        "backend": lambda a: do_all_reduce(a, SUM),
        "channel": lambda a: blocking(a, SUM),
        "start_wait": lambda a: channel.start("all_reduce", a, SUM).wait(),
        "procgroup": lambda a: pg.all_reduce(a),
    }
    columns = {"raw": "raw Allreduce", "raw_test": "raw Iallreduce+Test", "backend": "backend do_all_reduce",
               "channel": "channel blocking (recorded)", "start_wait": "channel start+wait",
               "procgroup": "procgroup.all_reduce"}
    rows = []
    for nbytes in args.sizes:
        iters, rounds = _plan(nbytes, args)
        a = np.ones(nbytes // 4, dtype=np.float32)
        rows.append((nbytes, interleaved_medians(variants, a, rounds=rounds, iters=iters, barrier=comm.Barrier,
                                                 warmup=min(iters, 1000))))
    return columns, rows


def _sendrecv(args: argparse.Namespace, pg: Any, comm: Any, MPI: Any,
              np: Any) -> tuple[dict[str, str], list[tuple[int, dict[str, float]]]]:
    """Ping-pong between ranks 0 and 1, each layer of procgroup's send/recv against raw."""
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

    do_send, do_recv = channel.do_send, channel.do_recv
    send, recv = channel.blocking("send"), channel.blocking("recv")
    variants: dict[str, Callable[[Any], None]] = {
        "raw": pingpong(lambda a: comm.Send(a, peer, 0), lambda a: comm.Recv(a, peer, 0)),
        "raw_test": pingpong(isend_test, irecv_test),
        "backend": pingpong(lambda a: do_send(a, peer, 0), lambda a: do_recv(a, peer, 0)),
        "channel": pingpong(lambda a: send(a, peer, 0), lambda a: recv(a, peer, 0)),
        "procgroup": pingpong(lambda a: pg.send(a, peer), lambda a: pg.recv(a, peer)),
    }
    columns = {"raw": "raw Send/Recv", "raw_test": "raw Isend/Irecv+Test", "backend": "backend do_send/do_recv",
               "channel": "channel blocking (recorded)", "procgroup": "procgroup send/recv"}
    rows = []
    for nbytes in args.sizes:
        iters, rounds = _plan(nbytes, args)
        iters = max(1, iters // 2) if nbytes < 2**16 else iters  # a round trip is two messages
        a = np.ones(nbytes // 4, dtype=np.float32)
        med = interleaved_medians(variants, a, rounds=rounds, iters=iters, barrier=comm.Barrier,
                                  warmup=min(iters, 1000))
        rows.append((nbytes, {k: v / 2 for k, v in med.items()}))  # one way
    return columns, rows


if __name__ == "__main__":
    main(sys.argv[1:])
