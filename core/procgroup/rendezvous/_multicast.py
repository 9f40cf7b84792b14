"""tcp://MULTICAST:PORT: processes find each other on a multicast group.

Each process announces ``(group_name, world_size, random id)`` every 100 ms. Once a
process has heard ``world_size`` ids it sorts them; the smallest id hosts a TCPStore
on a free port and announces ``(port, member ids)``. The others learn the master's
address from the source of that datagram, connect, and take their index in the sorted
list as rank. Announcements of other group names are ignored, so concurrent jobs only
need distinct group names.

Every announcement carries an HMAC (key: the job key, purpose ``mcast``); ones without
a valid one are ignored, so a stranger cannot steer a joiner. The TCPStore connection
it leads to runs the job-token handshake as every store connection does.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import struct
import threading
import time
import uuid

from procgroup import _auth
from procgroup.errors import InvalidArgumentError, RendezvousError, StoreTimeoutError

from ._result import RendezvousResult, job_store, join
from ._tcp import TCPStore

logger = logging.getLogger(__name__)

PROTOCOL = "procgroup-rdzv/1"
ANNOUNCE_EVERY = 0.1


class _Channel:
    """A UDP socket joined to the multicast group that also sends to it."""

    def __init__(self, group: str, port: int, ttl: int, key: bytes | None = None) -> None:
        self._key = key if key is not None else _auth.job_key(None)
        addr, _, zone = group.partition("%")
        self.v6 = ":" in addr
        family = socket.AF_INET6 if self.v6 else socket.AF_INET
        try:
            ifindex = socket.if_nametoindex(zone) if zone else 0
        except OSError:
            raise InvalidArgumentError(f"tcp://: unknown network interface {zone!r} in {group!r}") from None
        self.dest: tuple = (addr, port, 0, ifindex) if self.v6 else (addr, port)
        self.sock = socket.socket(family, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if self.v6:
                self.sock.bind(("", port, 0, ifindex) if ifindex else ("", port))
                mreq = socket.inet_pton(socket.AF_INET6, addr) + struct.pack("@I", ifindex)
                self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
                self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, ttl)
                self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 1)
                if ifindex:
                    self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, ifindex)
            else:
                self.sock.bind((addr, port))  # only datagrams sent to this group
                mreq = socket.inet_aton(addr) + socket.inet_aton("0.0.0.0")
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
                self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        except OSError as exc:
            self.sock.close()
            raise RendezvousError(
                f"tcp://: cannot join the multicast group {group}:{port}: {exc} (is there "
                "a multicast route? e.g. `ip route add 224.0.0.0/4 dev lo` for one host)"
            ) from exc
        self.sock.settimeout(0.05)
        self._send_lock = threading.Lock()

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, b"mcast\0" + body, hashlib.sha256).digest()

    def send(self, msg: dict) -> None:
        body = json.dumps(msg, separators=(",", ":")).encode()
        data = self._mac(body) + body
        with self._send_lock:
            try:
                self.sock.sendto(data, self.dest)
            except OSError as exc:  # no route yet, interface down: retried next round
                logger.debug("multicast send failed: %s", exc)

    def recv(self) -> tuple[dict, str] | None:
        try:
            data, src = self.sock.recvfrom(65536)
        except (TimeoutError, BlockingIOError, InterruptedError):
            return None
        mac, body = data[:32], data[32:]
        if len(mac) != 32 or not hmac.compare_digest(mac, self._mac(body)):
            return None  # not this job's (another token, a stranger): ignored
        try:
            msg = json.loads(body)
        except ValueError:
            return None
        if not isinstance(msg, dict) or msg.get("p") != PROTOCOL:
            return None
        host = src[0]
        if host in ("0.0.0.0", "::"):  # no source address: it came from this host
            host = "::1" if self.v6 else "127.0.0.1"
        if self.v6 and len(src) >= 4 and src[3] and host.startswith("fe80"):
            host = f"{host}%{socket.if_indextoname(src[3])}"
        return msg, host

    def close(self) -> None:
        self.sock.close()


def multicast_rendezvous(
    group: str, port: int, *, world_size: int, group_name: str, timeout: float, ttl: int = 1,
    token: str | bytes | None = None,
) -> RendezvousResult:
    """Assign ranks through multicast announcements; see the module docstring."""
    deadline = time.monotonic() + timeout
    key = _auth.resolve_token(token, group, where="tcp:// (multicast)")
    me = uuid.uuid4().hex
    base = {"p": PROTOCOL, "g": group_name, "ws": world_size}
    chan = _Channel(group, port, ttl, key)
    peers: dict[str, str] = {}  # id -> source address
    foreign_masters = 0
    next_announce = 0.0
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise StoreTimeoutError(
                    f"tcp://: rendezvous timed out after {timeout:g}s: {len(peers | {me: ''})} "
                    f"of {world_size} ranks announced themselves on {group}:{port} "
                    f"(group_name {group_name!r}); missing {world_size - len(peers | {me: ''})} "
                    "ranks"
                    + (f"; {foreign_masters} announcement(s) of a group formed without this "
                       "process were seen (another job with the same group_name?)"
                       if foreign_masters else ""),
                    op="rendezvous",
                )
            if now >= next_announce:
                chan.send({**base, "t": "hello", "id": me})
                next_announce = now + ANNOUNCE_EVERY
            got = chan.recv()
            if got is not None:
                msg, src = got
                if msg.get("g") != group_name:
                    continue
                if msg.get("ws") != world_size:
                    raise RendezvousError(
                        f"tcp://: a process in group_name {group_name!r} on {group}:{port} "
                        f"has world_size {msg.get('ws')}, this one {world_size}"
                    )
                if msg.get("t") == "hello" and isinstance(msg.get("id"), str):
                    peers[msg["id"]] = src
                elif msg.get("t") == "master":
                    members = msg.get("members") or []
                    if isinstance(members, list) and me in members and isinstance(msg.get("port"), int):
                        rank = members.index(me)
                        logger.debug("multicast: master at %s:%s, rank %d", src, msg["port"], rank)
                        return _join_as_worker(src, int(msg["port"]), rank, world_size,
                                               group_name, deadline, timeout, chan, key)
                    foreign_masters += 1
            known = sorted(set(peers) | {me})
            if len(known) >= world_size and known[0] == me:
                members = known[:world_size]
                return _host(chan, base, members, peers.get(me), world_size, group_name,
                             deadline, timeout, key)
    finally:
        chan.close()


def _join_as_worker(
    host: str, port: int, rank: int, world_size: int, group_name: str, deadline: float,
    timeout: float, chan: _Channel, key: bytes,
) -> RendezvousResult:
    chan.close()  # nothing more to hear
    store = TCPStore(host, port, world_size, is_master=False,
                     timeout=max(0.1, deadline - time.monotonic()), wait_for_workers=False,
                     job_key=key)
    store.timeout = timeout
    return join(job_store(store, group_name), "tcp://", rank, world_size, deadline, host,
                total_timeout=timeout, job_key=key)


def _host(
    chan: _Channel, base: dict, members: list[str], own_addr: str | None, world_size: int,
    group_name: str, deadline: float, timeout: float, key: bytes,
) -> RendezvousResult:
    """Become rank 0: serve a TCPStore and announce it until every member has joined."""
    # listen on the address the others will connect to (the source of our announcements)
    store = TCPStore(own_addr or "", 0, world_size, is_master=True, timeout=timeout,
                     wait_for_workers=False, job_key=key)
    announce = {**base, "t": "master", "port": store.port, "members": members}
    stop = threading.Event()

    def announcer() -> None:
        while not stop.is_set():
            chan.send(announce)
            stop.wait(ANNOUNCE_EVERY)

    thread = threading.Thread(target=announcer, name="procgroup-multicast-announce", daemon=True)
    thread.start()
    addr = own_addr or ("::1" if chan.v6 else "127.0.0.1")
    try:
        return join(job_store(store, group_name), "tcp://", 0, world_size, deadline, addr,
                    total_timeout=timeout, job_key=key)
    finally:
        stop.set()
        thread.join(timeout=5)
