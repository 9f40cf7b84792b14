"""Connections of the tcp backend: the mesh set-up and one Peer per remote rank.

A Peer owns its socket, a reader thread that parses frames, and an ordered send path
(a lock for writes on the caller's thread, a one-thread queue for started sends).
It knows nothing of receives: where a frame's payload lands, and what a lost peer
means, it asks of the layer above through the :class:`PeerEvents` it is given.
"""

from __future__ import annotations

import abc
import concurrent.futures
import logging
import socket
import threading
import time
from typing import Any, Protocol

from procgroup.backend import ChannelContext, fresh
from procgroup.errors import CommTimeoutError, PeerError

from . import _wire

log = logging.getLogger(__name__)


def left_error(global_rank: int) -> PeerError:
    """A peer that said goodbye: it called destroy_process_group, or its process ended."""
    return PeerError(f"rank {global_rank} has left the group (it called destroy_process_group or its "
                     f"process exited)", rank=global_rank)


class Landing(Protocol):
    """Where a frame's payload goes: a posted receive, or a buffer of the unexpected queue."""

    def admit(self, nbytes: int, dtype_char: bytes, sender: int) -> memoryview:
        """The buffer to fill with the payload; raise to refuse the frame (size/dtype)."""

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        """The payload has landed (or was refused with ``error``)."""

    def fail(self, error: BaseException) -> None:
        """The payload will never land (the peer died, the channel closed)."""


class PeerEvents(abc.ABC):
    """What a Peer's reader reports to the layer above (the channel)."""

    @abc.abstractmethod
    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes) -> Landing:
        """Where the payload of a frame from ``src`` lands."""

    @abc.abstractmethod
    def peer_left(self, peer: Peer) -> None:
        """``peer`` said goodbye (a clean close); what it sent before is delivered."""

    @abc.abstractmethod
    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        """``peer``'s connection broke without a goodbye."""


def _send_all(sock: socket.socket, header: bytes, payload: memoryview) -> None:
    """Header and payload in one gathered write (no copy, one syscall when it all fits)."""
    parts = [memoryview(header), payload]
    while parts:
        sent = sock.sendmsg(parts)
        while sent and parts:
            if sent >= parts[0].nbytes:
                sent -= parts[0].nbytes
                parts.pop(0)
            else:
                parts[0] = parts[0][sent:]
                sent = 0
        while parts and parts[0].nbytes == 0:
            parts.pop(0)


def connect_mesh(ctx: ChannelContext, address: str) -> dict[int, socket.socket]:
    """Connect to every other rank of the channel; returns rank -> connected socket.

    Every rank listens on port 0 and publishes its address in the Store (no port
    races); rank i connects to ranks below it (their listen backlog completes the
    handshake before they accept) and then accepts the ranks above it.
    """
    deadline = time.monotonic() + ctx.timeout
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socks: dict[int, socket.socket] = {}
    try:
        listener.bind((address, 0))
        listener.listen(max(ctx.size, 16))
        host, port = listener.getsockname()[:2]
        ctx.store.set(f"tcp/addr/{ctx.rank}", f"{host}:{port}")
        for peer in range(ctx.rank):
            socks[peer] = _connect_to(ctx, peer, deadline)
        expected = set(range(ctx.rank + 1, ctx.size))
        while expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(ctx.global_rank(r) for r in expected)
                raise CommTimeoutError(
                    f"tcp: ranks {missing} did not connect within {ctx.timeout}s", op="init", ranks=missing
                )
            listener.settimeout(min(remaining, 1.0))
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                peer = _wire.unpack_hello(_recv_exact_small(conn, _wire.HELLO_SIZE), ctx.size, ctx.group_id)
            except (OSError, ValueError) as exc:
                log.warning("tcp: rejected a connection with a bad hello: %s", exc)
                conn.close()
                continue
            if peer not in expected:
                log.warning("tcp: rejected an unexpected connection from rank %d", peer)
                conn.close()
                continue
            expected.discard(peer)
            socks[peer] = conn
        for sock in socks.values():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(ctx.timeout)
        return socks
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    finally:
        listener.close()


def _connect_to(ctx: ChannelContext, peer: int, deadline: float) -> socket.socket:
    remaining = max(deadline - time.monotonic(), 0.1)
    addr = ctx.store.get(f"tcp/addr/{peer}", timeout=remaining).decode()
    host, port = addr.rsplit(":", 1)
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.1))
            sock.sendall(_wire.pack_hello(ctx.rank, ctx.size, ctx.group_id))
            return sock
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    gr = ctx.global_rank(peer)
    raise CommTimeoutError(f"tcp: could not connect to rank {gr} at {addr} within {ctx.timeout}s: {last}",
                           op="init", ranks=[gr])


def _recv_exact_small(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ValueError("connection closed during hello")
        data += chunk
    return data


class Peer:
    """One remote rank: its socket, a reader thread, and an ordered send path.

    Frames between one pair never overtake each other: each direction is one TCP
    stream, and sends are serialised by the send lock, behind any queued sends.
    """

    def __init__(self, rank: int, global_rank: int, sock: socket.socket, timeout: float,
                 events: PeerEvents) -> None:
        self.rank = rank
        self.global_rank = global_rank
        self.sock = sock
        self.timeout = timeout
        self.events = events
        self.left = False  # sent a goodbye frame
        self._closing = False
        self._send_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queued = 0
        self._sender: concurrent.futures.ThreadPoolExecutor | None = None
        self._seq_out = 0
        self._seq_in = 0
        self._reader = threading.Thread(target=self._read_loop, name=f"procgroup-tcp-recv-{global_rank}",
                                        daemon=True)
        self._send_error: BaseException | None = None
        self._current: Landing | None = None  # where the reader is landing a payload now

    def start_reader(self) -> None:
        self._reader.start()

    # ------------------------------------------------------------------ sending
    @property
    def has_queued_sends(self) -> bool:
        return self._queued > 0

    def send(self, view: memoryview, tag: int, dtype_char: bytes) -> None:
        """Blocking send on the caller's thread; goes behind queued sends, keeping order."""
        if self._queued:
            self.send_async(view, tag, dtype_char).result()
            return
        self._write(view, tag, dtype_char)

    def send_async(self, view: memoryview, tag: int, dtype_char: bytes) -> concurrent.futures.Future[None]:
        """Queue a send on this peer's sender thread (started on first use)."""
        with self._queue_lock:
            if self._sender is None:
                self._sender = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"procgroup-tcp-send-{self.global_rank}")
            self._queued += 1
        fut = self._sender.submit(self._write, view, tag, dtype_char)
        fut.add_done_callback(self._dequeue)
        return fut

    def _dequeue(self, _: Any) -> None:
        with self._queue_lock:
            self._queued -= 1

    def _write(self, view: memoryview, tag: int, dtype_char: bytes) -> None:
        if self._send_error is not None:
            raise fresh(self._send_error)
        with self._send_lock:
            header = _wire.pack_header(_wire.KIND_DATA, dtype_char, tag, self._seq_out, view.nbytes)
            self._seq_out += 1
            try:
                _send_all(self.sock, header, view)
            except TimeoutError:
                # part of the frame may be out: the stream cannot be trusted any more
                self.events.peer_failed(self, PeerError(
                    f"rank {self.global_rank} stopped reading: a send to it timed out after {self.timeout}s",
                    rank=self.global_rank))
                raise CommTimeoutError(
                    f"send to rank {self.global_rank} timed out after {self.timeout}s (it is not reading)",
                    op="send", ranks=[self.global_rank]) from None
            except OSError as exc:
                lost = PeerError(f"rank {self.global_rank} is unreachable: connection lost while sending ({exc})",
                                 rank=self.global_rank)
                self.events.peer_failed(self, lost)
                raise lost from None

    def fail_pending_sends(self, exc: BaseException) -> None:
        self._send_error = exc

    def fail_current(self, exc: BaseException) -> None:
        """Fail the payload this peer's reader is landing (the peer died or we close)."""
        target = self._current
        if target is not None:
            target.fail(exc)

    # ------------------------------------------------------------------ receiving
    def _read_loop(self) -> None:
        header = bytearray(_wire.HEADER_SIZE)
        hview = memoryview(header)
        try:
            while True:
                if not self._read_into(hview, at_boundary=True):
                    return
                kind, dtype_char, tag, seq, nbytes = _wire.unpack_header(header)
                if kind == _wire.KIND_GOODBYE:
                    self.left = True
                    self.events.peer_left(self)
                    return
                if seq != self._seq_in:
                    raise ValueError(f"frame {seq} arrived where {self._seq_in} was due")
                self._seq_in += 1
                self._receive_payload(tag, nbytes, dtype_char)
        except Exception as exc:  # noqa: BLE001 - whatever stops the reader breaks the channel
            if self._closing:
                self.fail_current(PeerError(f"the connection to rank {self.global_rank} was closed",
                                            rank=self.global_rank))
                return
            reason = exc if isinstance(exc, PeerError) else PeerError(
                f"lost the connection to rank {self.global_rank}: {exc}", rank=self.global_rank)
            self.events.peer_failed(self, reason)

    def _receive_payload(self, tag: int, nbytes: int, dtype_char: bytes) -> None:
        target = self.events.match_incoming(self.rank, tag, nbytes, dtype_char)
        try:
            view = target.admit(nbytes, dtype_char, self.global_rank)
        except Exception as exc:  # noqa: BLE001 - reported to the receiver, stream kept in sync
            self._discard(nbytes)
            target.finish(self.rank, exc)
            return
        self._current = target
        self._read_into(view, at_boundary=False)
        self._current = None
        target.finish(self.rank)

    def _discard(self, nbytes: int) -> None:
        scratch = memoryview(bytearray(min(nbytes, 1 << 20)))
        while nbytes > 0:
            n = min(nbytes, len(scratch))
            self._read_into(scratch[:n], at_boundary=False)
            nbytes -= n

    def _read_into(self, view: memoryview, *, at_boundary: bool) -> bool:
        """Fill ``view`` from the socket. False on a clean EOF before a frame starts.

        Idle time between frames is normal, so a timeout there just loops; a peer that
        stalls in the middle of a frame for longer than the timeout is reported dead.
        """
        got, total = 0, view.nbytes
        while got < total:
            try:
                n = self.sock.recv_into(view[got:], total - got)
            except TimeoutError:
                if at_boundary and got == 0 and not self._closing:
                    continue
                raise PeerError(
                    f"rank {self.global_rank} stalled for {self.timeout}s in the middle of a message",
                    rank=self.global_rank) from None
            if n == 0:
                if self._closing and at_boundary and got == 0:
                    return False
                if self._closing:
                    raise PeerError(f"the connection to rank {self.global_rank} was closed mid-message",
                                    rank=self.global_rank)
                raise PeerError(
                    f"rank {self.global_rank} closed its connection without a goodbye "
                    f"(the process died or exited without destroy_process_group)", rank=self.global_rank)
            got += n
        return True

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Say goodbye (unless the peer is gone) and close the socket."""
        self._closing = True
        # a sender stuck on a dead peer must not hold up teardown for long
        if not self.left and self._send_error is None and self._send_lock.acquire(timeout=1.0):
            try:
                self.sock.settimeout(1.0)
                self.sock.sendall(_wire.pack_header(_wire.KIND_GOODBYE, b"B", 0, self._seq_out, 0))
            except OSError:
                pass
            finally:
                self._send_lock.release()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self._sender is not None:
            self._sender.shutdown(wait=False, cancel_futures=True)


__all__ = ["Landing", "Peer", "PeerEvents", "connect_mesh", "left_error"]
