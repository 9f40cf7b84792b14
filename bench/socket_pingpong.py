"""8 B one-way over the tcp socket path against a raw Python echo, in the same two processes.

Issue 15's goal compares procgroup's socket path (``PROCGROUP_TCP_SHM=0``, what runs
between hosts) with a raw Python TCP echo on loopback (``bench/socket_echo.py``). On a
small shared host a run's absolute times depend on where the scheduler puts the two
processes and on other jobs, by up to 2x from one run to the next; so this script
measures both in the *same* pair of processes, alternating round by round: a
procgroup ping-pong (``send`` then ``recv`` on rank 0, the echo on rank 1) and a raw
echo over a second TCP connection between the same ranks (TCP_NODELAY, blocking
``sendall`` and ``recv_into``, no framing). Each round times ``--iters`` round trips
back to back; one-way = half a round trip; the medians over rounds and their ratio
are printed. Run from the repository root (any venv with procgroup installed)::

    PROCGROUP_TCP_SHM=0 .venv313/bin/python bench/socket_pingpong.py [--nbytes 8] [--iters 2000] [--rounds 15]

It re-launches itself as 2 ranks with procgroup-run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

from socket_echo import recv_exact  # bench/: the raw echo's exact read


def _relaunch(argv: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "procgroup.run", "--nproc-per-node", "2", "--no-prefix",
                            os.path.abspath(__file__), *argv])


def _raw_pair(rank: int) -> socket.socket:
    """A second, raw TCP connection between ranks 0 and 1 (rank 1 listens)."""
    import procgroup as pg

    listener = socket.socket() if rank == 1 else None
    port = [0]
    if listener is not None:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = [listener.getsockname()[1]]
    pg.broadcast_object_list(port, src=1)
    if listener is not None:
        sock, _ = listener.accept()
        listener.close()
    else:
        sock = socket.create_connection(("127.0.0.1", port[0]))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nbytes", type=int, default=8, help="message size in bytes (default 8)")
    parser.add_argument("--iters", type=int, default=2000, help="round trips per round")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        sys.exit(_relaunch(argv))

    import numpy as np
    import procgroup as pg

    pg.init_process_group("tcp")
    rank = pg.get_rank()
    if pg.get_world_size() != 2:
        raise SystemExit("run with 2 ranks")
    sock = _raw_pair(rank)
    arr = np.zeros(args.nbytes // 4, dtype=np.float32) if args.nbytes % 4 == 0 else np.zeros(args.nbytes, np.uint8)
    raw = memoryview(bytearray(max(args.nbytes, 1)))[: args.nbytes]
    other = 1 - rank

    def procgroup_round(n: int) -> None:
        if rank == 0:
            for _ in range(n):
                pg.send(arr, other)
                pg.recv(arr, other)
        else:
            for _ in range(n):
                pg.recv(arr, other)
                pg.send(arr, other)

    def raw_round(n: int) -> None:
        if rank == 0:
            for _ in range(n):
                sock.sendall(raw)
                recv_exact(sock, raw)
        else:
            for _ in range(n):
                recv_exact(sock, raw)
                sock.sendall(raw)

    contenders = {"procgroup": procgroup_round, "raw echo": raw_round}
    for fn in contenders.values():  # warm-up
        fn(min(args.iters, 500))
    per_round: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(args.rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            pg.barrier()
            t0 = time.perf_counter()
            contenders[name](args.iters)
            per_round[name].append((time.perf_counter() - t0) / args.iters / 2 * 1e6)
    if rank == 0:
        import procgroup_tcp

        med = {name: statistics.median(times) for name, times in per_round.items()}
        ratios = [p / q for p, q in zip(per_round["procgroup"], per_round["raw echo"])]
        print(f"procgroup {pg.__version__} from {os.path.dirname(procgroup_tcp.__file__)}, "
              f"PROCGROUP_TCP_SHM={os.environ.get('PROCGROUP_TCP_SHM', '(unset)')}, {args.nbytes} B one-way, "
              f"{args.iters} round trips x {args.rounds} rounds")
        for name, times in per_round.items():
            print(f"  {name:10s} median {med[name]:7.2f} us  (min {min(times):.2f}, max {max(times):.2f})")
        print(f"  procgroup / raw echo: {med['procgroup'] / med['raw echo']:.2f}x "
              f"(median of the per-round ratios {statistics.median(ratios):.2f}x)")
    sock.close()
    pg.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
