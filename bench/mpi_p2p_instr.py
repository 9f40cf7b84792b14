"""Instructions per 8 B send+recv of the mpi backend, layer by layer (callgrind).

Machine load does not change instruction counts, so this ranks the layers' costs where
wall-clock ratios on a shared host cannot (docs/backends/mpi.md, "send/recv"). One MPI
singleton (no mpiexec) sends to itself: per iteration a raw ``Irecv`` is posted, the
contender's send runs, then a raw ``Isend`` is posted and the contender's receive runs
(the two raw requests are common to every contender). Contenders, each called as
``f(array, peer, tag)``: raw ``Send``/``Recv``; raw ``Isend``/``Irecv`` + a ``Test`` loop;
the backend alone (``do_send``/``do_recv``); the channel's blocking callables (the flight
recorder's entry around them); ``procgroup.send``/``recv`` (the core's fast path, given
a rank translation under which rank 0 is a peer). Each loop runs inside
``functools.reduce``, the only place callgrind collects (imports run ``exec``, so exec is
no marker); one dump each. Needs valgrind.

    python bench/mpi_p2p_instr.py [--calls 1000]
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import re
import subprocess
import sys
import tempfile
from typing import Any


def _inner(calls: int) -> None:
    import numpy as np
    from mpi4py import MPI

    import procgroup as dist
    from procgroup import _ops, _state

    dist.init_process_group("mpi")
    group = _state.resolve(None)
    channel = group.channel
    comm = channel._comm  # tag 0 travels on the channel's first communicator
    a = np.ones(2, np.float32)
    b = np.zeros(2, np.float32)
    status_type = MPI.Status

    def isend_test(x: Any, dst: int, tag: int) -> None:
        req = comm.Isend(x, dst, tag)
        while not req.Test():
            pass

    def irecv_test(x: Any, src: int, tag: int) -> None:
        status = status_type()
        req = comm.Irecv(x, src, tag)
        while not req.Test(status):
            pass

    def public() -> tuple[Any, Any]:
        # this process's own rank 0 taken for a peer's, so that the fast path's checks pass
        fast = group.fast
        if hasattr(fast, "peers"):  # the group's other members, world rank -> group rank
            fast.peers = {0: 0}
        elif hasattr(fast, "_replace"):  # older trees (before/after runs): a NamedTuple with "me"
            fast = fast._replace(me=-1)
        else:
            fast.me = -1
        group.fast = _ops._world_fast = fast
        _ops._p2p_dtypes.add(a.dtype)
        send, recv = dist.send, dist.recv
        return (lambda x, d, t: send(x, d)), (lambda x, s, t: recv(x, s))

    contenders = {
        "raw Send/Recv": lambda: (comm.Send, comm.Recv),
        "raw Isend/Irecv + Test": lambda: (isend_test, irecv_test),
        "backend do_send/do_recv": lambda: (channel.do_send, channel.do_recv),
        "channel blocking (recorded)": lambda: (channel.blocking("send"), channel.blocking("recv")),
        "procgroup.send/recv": public,
    }
    names = []
    for name, make in contenders.items():
        send, recv = make()

        def loop(n: int, send: Any = send, recv: Any = recv) -> None:
            for _ in range(n):
                posted = comm.Irecv(b, 0, 0)
                send(a, 0, 0)
                posted.Wait()
                posted = comm.Isend(a, 0, 0)
                recv(b, 0, 0)
                posted.Wait()

        loop(300)  # warm: caches, specialised bytecode
        functools.reduce(lambda _x, _y: loop(calls), (0, 0))
        names.append(name)
    print("CONTENDERS " + json.dumps(names), flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        _inner(args.calls)
        return
    with tempfile.TemporaryDirectory() as out:
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=functools_reduce",
               "--dump-after=functools_reduce", f"--callgrind-out-file={out}/cg.out",
               sys.executable, __file__, "--inner", "--calls", str(args.calls)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600)
        names = json.loads(done.stdout.split("CONTENDERS ", 1)[1].splitlines()[0])
        dumps = sorted(glob.glob(f"{out}/cg.out.*"), key=lambda path: int(path.rsplit(".", 1)[1]))
        totals = []
        for path in dumps:
            with open(path, encoding="utf-8") as f:
                found = re.search(r"^totals: (\d+)", f.read(), re.M)
            totals.append(int(found.group(1)) if found else 0)
    # imports may call functools.reduce too: the contenders' dumps are the last ones
    per_pair = dict(zip(names, (t / args.calls for t in totals[-len(names):])))
    base = per_pair[names[1]]
    print(f"{'contender':30s} {'Ir per send+recv':>18s} {'vs Isend/Irecv + Test':>22s}")
    for name, n in per_pair.items():
        print(f"{name:30s} {n:18,.0f} {n - base:+22,.0f}")


if __name__ == "__main__":
    main()
