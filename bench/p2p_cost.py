"""What one small shared-memory message costs the tcp backend (docs/performance.md, point to point).

Two measurements, both independent of how loaded the machine is:

``instr``: instructions per call, counted by callgrind, of a blocking send and of a blocking
receive that finds its message in the ring, at the channel's level (what ``do_send`` and
``do_recv`` call: ``ShmP2P.send_small``/``send`` and ``ShmP2P.recv_direct``), in one process
writing a ring it reads itself. Each loop runs inside ``exec()``, the only place callgrind
collects. Needs valgrind.

``cpu``: thread CPU time per message of ``pg.send`` and ``pg.recv`` (the whole stack: op
layer, flight recorder, channel, ring), two ranks: rank 0 sends ``--calls`` messages while
rank 1 sleeps, then rank 1 receives them all (every message already in the ring, so nothing
waits); the best of ``--rounds``.

Either runs the tcp backend it imports, so an export of an older ``backends/tcp`` on
``PYTHONPATH`` measures that one::

    .venv313/bin/python bench/p2p_cost.py instr [--nbytes 8]
    .venv313/bin/python bench/p2p_cost.py cpu [--nbytes 8]
    PYTHONPATH=/tmp/before/backends/tcp .venv313/bin/python bench/p2p_cost.py instr
"""

from __future__ import annotations

import argparse
import glob
import mmap
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def _calls(nbytes: int) -> tuple[Callable[[Any], None], Callable[[Any], int], Any, Any]:
    """(send, receive, array to send, array to receive into) over a ring to this process."""
    import numpy as np
    from procgroup_tcp import _p2p
    from procgroup_tcp._doorbell import BLOCK_BYTES, Doorbell
    from procgroup_tcp._ring import RingReader, RingWriter, ring_bytes
    from procgroup_tcp._wire import DTYPE_CODES, NO_FP, byte_view, dtype_code

    cap = _p2p.RING_BYTES
    view = memoryview(mmap.mmap(-1, BLOCK_BYTES + ring_bytes(cap)))
    link = _p2p.OutLink(0, 0, RingWriter(view, BLOCK_BYTES, cap), Doorbell(view), True)
    inbound = {0: _p2p.InLink(0, 0, RingReader(view, BLOCK_BYTES, cap), os.getpid())}
    p2p = _p2p.ShmP2P([], [], Doorbell(view), {0: link}, inbound, 10.0, lambda: None, lambda r: False,
                      None, None)  # type: ignore[arg-type]  # no matcher: only direct receives run
    small = getattr(_p2p, "SMALL_BYTES", 0)  # absent before the small-message path

    if hasattr(p2p, "send_small"):  # what channel.do_send/do_recv do since the small-message path
        def send(a: Any) -> None:
            code = DTYPE_CODES.get(a.dtype) or dtype_code(a.dtype)
            if a.nbytes <= small and p2p.send_small(link, a.tobytes(), 0, code, NO_FP):
                return
            p2p.send(link, byte_view(a), 0, code, NO_FP)

        def recv(a: Any) -> int:
            return p2p.recv_direct(0, a, 0)
    else:  # the channel before it
        def send(a: Any) -> None:
            code = DTYPE_CODES.get(a.dtype) or dtype_code(a.dtype)
            p2p.send(link, byte_view(a), 0, code, NO_FP)

        def recv(a: Any) -> int:
            return p2p.recv_direct(0, byte_view(a), a.dtype, 0)  # type: ignore[call-arg, arg-type]  # the old signature

    a = np.zeros(max(nbytes // 4, 1), dtype=np.float32)
    return send, recv, a, a.copy()


def _inner(calls: int, nbytes: int) -> None:
    send, recv, a, b = _calls(nbytes)
    g = {"send": send, "recv": recv, "a": a, "b": b, "N": calls}
    exec("for _ in range(N): send(a)\nfor _ in range(N): recv(b)", g)  # warm-up
    exec("for _ in range(N): send(a)", g)
    exec("for _ in range(N): recv(b)", g)
    exec("for _ in range(N): pass", g)  # the loop alone


def instr(calls: int, nbytes: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=builtin_exec",
                        "--dump-after=builtin_exec", f"--callgrind-out-file={out}/cg.out", sys.executable,
                        os.path.abspath(__file__), "_inner", "--calls", str(calls), "--nbytes", str(nbytes)],
                       check=True, capture_output=True, timeout=3600)
        dumps = sorted(glob.glob(f"{out}/cg.out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        totals = []
        for path in dumps[-3:]:
            with open(path, encoding="utf-8") as f:
                found = re.search(r"^totals: (\d+)", f.read(), re.M)
            totals.append(int(found.group(1)) if found else 0)
    loop = totals[2] / calls
    print(f"{nbytes} B: send {totals[0] / calls - loop:,.0f}, direct receive {totals[1] / calls - loop:,.0f} "
          f"instructions per call")


def cpu(calls: int, nbytes: int, rounds: int) -> None:
    if "RANK" not in os.environ:
        sys.exit(subprocess.call([sys.executable, "-m", "procgroup.run", "--nproc-per-node", "2", "--no-prefix",
                                  os.path.abspath(__file__), *sys.argv[1:]]))
    import numpy as np
    import procgroup as pg

    pg.init_process_group("tcp")
    rank = pg.get_rank()
    a = np.zeros(max(nbytes // 4, 1), dtype=np.float32)
    best = float("inf")
    for _ in range(rounds):
        pg.barrier()
        if rank == 1:
            time.sleep(1.0)  # rank 0 fills the ring meanwhile
        t0 = time.thread_time()
        for _ in range(calls):
            if rank == 0:
                pg.send(a, 1)
            else:
                pg.recv(a, 0)
        best = min(best, (time.thread_time() - t0) / calls * 1e6)
    got: list[Any] = [None, None]
    pg.all_gather_object(got, best)
    if rank == 0:
        print(f"{a.nbytes} B: pg.send {got[0]:.2f} us, pg.recv {got[1]:.2f} us of CPU per message "
              f"(best of {rounds} rounds of {calls})")
    pg.destroy_process_group()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("instr", "cpu", "_inner"))
    parser.add_argument("--nbytes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=None, help="messages per round (instr 2000, cpu 3000)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.what == "instr":
        # every send of a loop lands in the one ring before its receives run: they must fit
        from procgroup_tcp._p2p import RING_BYTES
        from procgroup_tcp._ring import HEADER_BYTES

        most = RING_BYTES // ((HEADER_BYTES + args.nbytes + 7) & ~7) - 1  # one record's room for a pad
        if (args.calls or 2000) > most:
            parser.error(f"{args.calls or 2000} messages of {args.nbytes} B do not fit the ring "
                         f"({RING_BYTES} bytes): --calls {most} at most")
    if args.what == "_inner":
        _inner(args.calls or 2000, args.nbytes)
    elif args.what == "instr":
        instr(args.calls or 2000, args.nbytes)
    else:
        # 3000 small records fit a ring: the sender never waits (the ring is 1 MiB)
        cpu(args.calls or 3000, args.nbytes, args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
