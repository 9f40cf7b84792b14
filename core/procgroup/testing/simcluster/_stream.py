"""A raw TCP stream between two simulated hosts: what the links carry, without procgroup.

``python -m procgroup.testing.simcluster._stream recv PORT NBYTES`` accepts one
connection, reads NBYTES, prints ``RECEIVED <bytes> <seconds>``: the bytes after the first
read and the time they took (so neither the connection set-up nor what was buffered
before the first read counts); ``send HOST PORT NBYTES`` connects (retrying until the
receiver listens) and writes NBYTES. ``echo PORT N`` and ``ping HOST PORT N`` bounce
8 bytes N times; ping prints ``RTT <median seconds>``.
"""

from __future__ import annotations

import socket
import sys
import time

CHUNK = 1 << 20


def receive(port: int, nbytes: int, timeout: float = 60.0) -> tuple[int, float]:
    with socket.create_server(("0.0.0.0", port)) as srv:
        srv.settimeout(timeout)
        conn, _ = srv.accept()
    with conn:
        conn.settimeout(timeout)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        first = conn.recv_into(view)
        # the clock starts after the first bytes, which are not counted
        start = time.perf_counter()
        got = 0
        while first + got < nbytes:
            n = conn.recv_into(view[: min(CHUNK, nbytes - first - got)])
            if n == 0:
                break
            got += n
        elapsed = time.perf_counter() - start
        conn.sendall(b"k")  # the sender leaves only after everything arrived
    return got, elapsed


def send(host: str, port: int, nbytes: int, timeout: float = 60.0) -> None:
    with _connect(host, port, timeout) as conn:
        block = memoryview(bytes(CHUNK))
        left = nbytes
        while left > 0:
            n = min(CHUNK, left)
            conn.sendall(block[:n])
            left -= n
        conn.recv(1)


def _connect(host: str, port: int, timeout: float) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=timeout)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            raise ConnectionError("the peer closed the connection")
        data += more
    return data


def echo(port: int, count: int, timeout: float = 60.0) -> None:
    with socket.create_server(("0.0.0.0", port)) as srv:
        srv.settimeout(timeout)
        conn, _ = srv.accept()
    with conn:
        conn.settimeout(timeout)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            conn.sendall(_exactly(conn, 8))


def ping(host: str, port: int, count: int, timeout: float = 60.0) -> float:
    times = []
    with _connect(host, port, timeout) as conn:
        for _ in range(count):
            start = time.perf_counter()
            conn.sendall(b"8 bytes!")
            _exactly(conn, 8)
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "echo":
        echo(int(argv[1]), int(argv[2]))
        return 0
    if len(argv) == 4 and argv[0] == "ping":
        print(f"RTT {ping(argv[1], int(argv[2]), int(argv[3])):.9f}", flush=True)
        return 0
    if len(argv) == 3 and argv[0] == "recv":
        got, elapsed = receive(int(argv[1]), int(argv[2]))
        print(f"RECEIVED {got} {elapsed:.6f}", flush=True)
        return 0
    if len(argv) == 4 and argv[0] == "send":
        send(argv[1], int(argv[2]), int(argv[3]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
