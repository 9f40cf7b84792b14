"""What the job-token handshake costs per TCPStore connection (docs/security.md, "Cost").

Usage: python bench/store_handshake.py [connections]

Opens N connections to a TCPStore server on loopback and times, per connection, the TCP
connect alone and the connect plus the handshake (3 messages: 40, 64, 33 bytes; 4 HMAC-
SHA256 over 100 bytes); also the handshake's computation alone (no sockets). Nothing is
paid per message after the handshake: requests are unchanged.
"""

from __future__ import annotations

import socket
import statistics
import sys
import time

from procgroup import _auth
from procgroup.rendezvous import TCPStore
from procgroup.rendezvous._tcp_server import PURPOSE


def main(n: int = 2000) -> None:
    key = _auth.job_key("bench")
    master = TCPStore("127.0.0.1", 0, is_master=True, job_key=key, timeout=60)
    master.close_grace = 0
    connect, handshake = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        sock = socket.create_connection(("127.0.0.1", master.port))
        t1 = time.perf_counter()
        _auth.client_handshake(sock, key, PURPOSE, "bench")
        t2 = time.perf_counter()
        sock.close()
        connect.append(t1 - t0)
        handshake.append(t2 - t1)
    master.close()
    compute = []
    for _ in range(n):
        t0 = time.perf_counter()
        s, c = _auth.ServerHandshake(key, PURPOSE), _auth.ClientHandshake(key, PURPOSE, "bench")
        _, verdict = s.verdict(c.reply(s.greeting()))
        c.check(verdict)
        compute.append(time.perf_counter() - t0)

    def us(xs: list[float]) -> float:
        return statistics.median(xs) * 1e6

    print(f"{n} connections on loopback, medians:")
    print(f"  TCP connect alone          {us(connect):8.1f} us")
    print(f"  handshake (round trips)    {us(handshake):8.1f} us")
    print(f"  handshake computation only {us(compute):8.1f} us")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
