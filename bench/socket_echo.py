"""The floor for procgroup's socket path: a raw Python TCP echo on loopback.

Two processes, one TCP connection (TCP_NODELAY), no framing: rank 0 sends ``nbytes``,
rank 1 reads them with ``recv_into`` and sends them back. The time of each round trip
is taken with ``perf_counter_ns``; one-way latency is half of it, as procgroup-bench's
``pingpong`` reports. The issue's goal is procgroup's 8 B one-way within 2x of this.

``--mode thread`` adds what a design with a reader thread pays: both processes read
on a second thread that hands each message to the main thread through a
``threading.Event`` (GIL and condition wake-up), which isolates that hand-off's cost.
``--mode spin`` is the direct echo with the tcp backend's wait policy: each receive
first ``poll``s the socket without a timeout for up to 100 us (its ``SPIN_S``), yielding
the core between polls, then blocks; the floor for a caller that spins before it sleeps.
Run from the repository root, any of the venvs::

    .venv/bin/python bench/socket_echo.py [--sizes 8,64K,4M] [--iters 2000] [--rounds 5]
    .venv/bin/python bench/socket_echo.py --mode thread
    .venv/bin/python bench/socket_echo.py --mode spin
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import socket
import statistics
import threading
import time


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


SPIN_S = 100e-6
_SPIN = False  # --mode spin (set in each process)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    if _SPIN:  # watch the socket a while before blocking, as the tcp backend's waits do
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        end = time.perf_counter() + SPIN_S
        while not poller.poll(0) and time.perf_counter() < end:
            os.sched_yield()  # a process sharing this core runs meanwhile (it may be the sender)
    got = 0
    while got < view.nbytes:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


class _Reader:
    """Reads fixed-size messages on its own thread; the caller waits for each one."""

    def __init__(self, sock: socket.socket, nbytes: int) -> None:
        self.sock = sock
        self.buf = memoryview(bytearray(max(nbytes, 1)))[:nbytes]
        self.ready = threading.Event()
        self.consumed = threading.Event()
        self.consumed.set()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        try:
            while True:
                self.consumed.wait()
                self.consumed.clear()
                recv_exact(self.sock, self.buf)
                self.ready.set()
        except OSError:
            return

    def recv(self) -> memoryview:
        self.ready.wait()
        self.ready.clear()
        return self.buf

    def release(self) -> None:
        self.consumed.set()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _echo(port: int, sizes: list[int], total_iters: list[int], mode: str) -> None:
    global _SPIN
    _SPIN = mode == "spin"
    sock = _connect(port)
    for nbytes, iters in zip(sizes, total_iters):
        if mode == "thread":
            reader = _Reader(sock, nbytes)
            for _ in range(iters):
                buf = reader.recv()
                sock.sendall(buf)
                reader.release()
        else:
            buf = memoryview(bytearray(max(nbytes, 1)))[:nbytes]
            for _ in range(iters):
                recv_exact(sock, buf)
                sock.sendall(buf)
    sock.close()


def measure(sizes: list[int], iters: int, rounds: int, warmup: int, mode: str) -> dict[int, list[float]]:
    """Median one-way latency (us) of each round, per size."""
    global _SPIN
    _SPIN = mode == "spin"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    per_size = [rounds * (iters + warmup) for _ in sizes]
    child = mp.get_context("spawn").Process(target=_echo, args=(port, sizes, per_size, mode), daemon=True)
    child.start()
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out: dict[int, list[float]] = {}
    try:
        for nbytes in sizes:
            payload = memoryview(bytearray(nbytes))
            reader = _Reader(sock, nbytes) if mode == "thread" else None
            back = memoryview(bytearray(max(nbytes, 1)))[:nbytes]
            medians = []
            for _ in range(rounds):
                times = []
                for i in range(iters + warmup):
                    t0 = time.perf_counter_ns()
                    sock.sendall(payload)
                    if reader is not None:
                        reader.recv()
                        reader.release()
                    else:
                        recv_exact(sock, back)
                    if i >= warmup:
                        times.append((time.perf_counter_ns() - t0) / 2000.0)
                medians.append(statistics.median(times))
            out[nbytes] = medians
    finally:
        sock.close()
        listener.close()
        child.join(10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8", help="comma separated, units K/M/G (default 8)")
    parser.add_argument("--iters", type=int, default=2000, help="timed round trips per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--mode",
        choices=("direct", "thread", "spin"),
        default="direct",
        help="direct: the caller reads the socket; thread: a reader thread hands off; spin: direct, "
        "watching the socket up to 100 us before each blocking read",
    )
    args = parser.parse_args()
    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    iters = [args.iters if s <= (1 << 20) else max(args.iters // 100, 20) for s in sizes]
    for nbytes, n in zip(sizes, iters):
        result = measure([nbytes], n, args.rounds, min(args.warmup, n), args.mode)[nbytes]
        print(
            f"socket echo ({args.mode}) {nbytes:>10} B one-way: median {statistics.median(result):9.2f} us "
            f"(round medians {', '.join(f'{m:.2f}' for m in result)})",
            flush=True,
        )


if __name__ == "__main__":
    main()
