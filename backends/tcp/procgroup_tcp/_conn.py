"""Connections of the tcp backend: the mesh set-up and one Peer per remote rank.

A Peer owns its socket, an ordered send path (a lock for writes on the caller's
thread, a one-thread queue for started sends), its frame reader (``reader``, a
``_reader.FrameReader``), a reader thread that reads only while no waiting caller does
(``_progress``), and its life as one :class:`~procgroup_tcp._peer_state.PeerState`. It knows
nothing of receives: where a frame's payload lands, and what a lost peer means, it
asks of the layer above through the :class:`PeerEvents` it is given.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
from typing import Any

from procgroup.backend import (
    ChannelContext,
    client_handshake,
    env_bytes,
    fresh,
    job_key,
    recv_exact,
    server_handshake,
)
from procgroup.errors import CommTimeoutError, PeerError, ProcGroupError

from . import _wire
from ._peer_state import TRANSITIONS, PeerState
from ._progress import TICK_S, Engine
from ._reader import FrameReader, Landing, PeerEvents

log = logging.getLogger(__name__)


def left_error(global_rank: int) -> PeerError:
    """A peer that said goodbye: it called destroy_process_group, or its process ended."""
    return PeerError(f"rank {global_rank} has left the group (it called destroy_process_group or its "
                     f"process exited)", rank=global_rank, departed=True)


def _send_all(sock: socket.socket, header: bytes, payload: memoryview, timeout: float,
              engine: Engine | None = None) -> None:
    """Header and payload in one gathered write: no copy, one system call when the kernel
    takes it all. When its buffer is full, the rest goes out blocking, and ``engine``'s
    reader threads read meanwhile (the peer may be sending to us as well); a send that
    makes no progress for ``timeout`` seconds raises TimeoutError."""
    try:
        sent = sock.sendmsg((header, payload), (), _DONTWAIT)
    except BlockingIOError:
        sent = 0
    if sent == len(header) + payload.nbytes:
        return
    if engine is not None:
        engine.send_blocks()
    try:
        _send_rest(sock, [memoryview(header), payload], sent, timeout)
    finally:
        if engine is not None:
            engine.send_unblocks()


def _send_rest(sock: socket.socket, parts: list[memoryview], sent: int, timeout: float) -> None:
    """Blocking writes (the kernel's SO_SNDTIMEO tick bounds each) until ``parts`` are out."""
    last = _now()
    while True:
        while parts and sent >= parts[0].nbytes:
            sent -= parts.pop(0).nbytes
        if not parts:
            return
        if sent:
            parts[0] = parts[0][sent:]
        try:
            sent = sock.sendmsg(parts)
        except BlockingIOError:  # the tick passed with the buffer still full
            sent = 0
        now = _now()
        if sent:
            last = now
        elif now - last > timeout:
            raise TimeoutError(f"no progress for {timeout}s")


_now = time.monotonic
_TIMEVAL = struct.Struct("@ll")  # struct timeval (Linux)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_HEADER_SIZE = _wire.HEADER_SIZE
_KIND_DATA = _wire.KIND_DATA
_MAGIC = _wire.MAGIC
_pack_header = _wire.HEADER.pack

#: An accepted connection gets this long to prove the token and say hello.
HANDSHAKE_TIMEOUT_S = 5.0


#: SO_SNDBUF/SO_RCVBUF of the data sockets when PROCGROUP_TCP_SOCKET_BUFFER is unset;
#: 0 leaves the kernel's autotuning alone (docs/backends/tcp.md has the measurements).
SOCKET_BUFFER_BYTES = 0


def socket_buffer_bytes() -> int:
    """The socket buffer size asked for (PROCGROUP_TCP_SOCKET_BUFFER, bytes; 0: the kernel's)."""
    size = env_bytes("PROCGROUP_TCP_SOCKET_BUFFER", SOCKET_BUFFER_BYTES, hint="0: the kernel's autotuning")
    return int(size or 0)


def tune(sock: socket.socket, timeout: float) -> None:
    """A data socket's options: no Nagle delay (small frames leave at once), the buffer
    size asked for (a fixed size turns the kernel's autotuning off), and blocking mode
    with the kernel's SO_RCVTIMEO/SO_SNDTIMEO at the progress tick. Not Python's
    ``settimeout``: that polls before every recv and send (two system calls each, about
    2 us a message); the readers and writers count the channel ``timeout`` themselves."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    size = socket_buffer_bytes()
    if size:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    sock.settimeout(None)
    tick = _TIMEVAL.pack(int(TICK_S), int(TICK_S % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tick)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tick)


def _purpose(ctx: ChannelContext, nonce: bytes) -> bytes:
    """What the handshake binds to: this channel (group) of this job, at this listener."""
    return b"tcp/%d/" % ctx.group_id + nonce.hex().encode()


def connect_mesh(ctx: ChannelContext, address: str) -> dict[int, socket.socket]:
    """Connect to every other rank of the channel; returns rank -> connected socket.

    Every rank listens on port 0 of ``address`` (the chosen interface) and publishes
    ``host:port:nonce`` in the Store (no port races); rank i connects to ranks below it
    and accepts the ranks above it. Every connection starts with the job-token handshake
    (purpose ``tcp/<group>/<nonce>``), then the hello (rank, size, group, nonce). Each
    accepted socket is checked on a thread of its own with a short deadline, so a
    silent or slow stranger delays nobody; a failure is one log line, and the loop
    keeps accepting until every expected rank has a seat.
    """
    deadline = time.monotonic() + ctx.timeout
    key = ctx.job_key if ctx.job_key is not None else job_key(None)
    nonce = os.urandom(_wire.NONCE_SIZE)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socks: dict[int, socket.socket] = {}
    arrivals: queue.Queue[tuple[socket.socket, str, int | BaseException]] = queue.Queue()
    pending: set[socket.socket] = set()
    acceptor: threading.Thread | None = None
    try:
        listener.bind((address, 0))
        listener.listen(max(ctx.size, 16))
        host, port = listener.getsockname()[:2]
        ctx.store.set(f"tcp/addr/{ctx.rank}", f"{host}:{port}:{nonce.hex()}")
        expected = set(range(ctx.rank + 1, ctx.size))
        if expected:  # accept on a thread while this one connects to the ranks below
            acceptor = threading.Thread(target=_accept_loop, args=(listener, ctx, key, nonce, arrivals, pending,
                                                                   deadline),
                                        name=f"procgroup-tcp-accept-g{ctx.group_id}", daemon=True)
            acceptor.start()
        for peer in range(ctx.rank):
            socks[peer] = _connect_to(ctx, key, peer, deadline)
        while expected:
            if ctx.abort is not None:  # shrink: a member died, give up at once
                ctx.abort()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(ctx.global_rank(r) for r in expected)
                raise CommTimeoutError(
                    f"tcp: ranks {missing} did not connect within {ctx.timeout}s", op="init", ranks=missing
                )
            try:
                conn, who, outcome = arrivals.get(timeout=min(remaining, 0.5 if ctx.abort is None else 0.02))
            except queue.Empty:
                continue
            if isinstance(outcome, BaseException):
                log.warning("tcp: refused a connection from %s: %s", who, outcome)
                conn.close()
            elif outcome not in expected:
                log.warning("tcp: refused a connection from %s claiming rank %d, which %s", who,
                            ctx.global_rank(outcome), "already has a seat" if outcome in socks else "does not dial in")
                conn.close()
            else:
                expected.discard(outcome)
                socks[outcome] = conn
        for sock in socks.values():
            tune(sock, ctx.timeout)
        return socks
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    finally:
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept loop (Linux), which then ends
        except OSError:
            pass
        if acceptor is not None:
            acceptor.join(1.0)
        listener.close()  # strangers still in a handshake are cut off below
        for conn in list(pending):
            _close_quietly(conn)
        while not arrivals.empty():
            _close_quietly(arrivals.get_nowait()[0])


def _close_quietly(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


def _accept_loop(listener: socket.socket, ctx: ChannelContext, key: bytes, nonce: bytes,
                 arrivals: queue.Queue[tuple[socket.socket, str, int | BaseException]],
                 pending: set[socket.socket], deadline: float) -> None:
    """Accept until the listener closes; each connection is checked on its own thread."""
    listener.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            conn, addr = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return  # closed: every rank has its seat, or set-up failed
        who = f"{addr[0]}:{addr[1]}"
        pending.add(conn)
        threading.Thread(target=_admit, args=(conn, who, ctx, key, nonce, arrivals, pending),
                         name="procgroup-tcp-admit", daemon=True).start()


def _admit(conn: socket.socket, who: str, ctx: ChannelContext, key: bytes, nonce: bytes,
           arrivals: queue.Queue[tuple[socket.socket, str, int | BaseException]],
           pending: set[socket.socket]) -> None:
    """Handshake, then hello, within HANDSHAKE_TIMEOUT_S; the outcome goes to ``arrivals``."""
    outcome: int | BaseException
    try:
        limit = min(HANDSHAKE_TIMEOUT_S, max(ctx.timeout, 0.1))
        start = time.monotonic()
        server_handshake(conn, key, _purpose(ctx, nonce), who, limit)
        conn.settimeout(max(limit - (time.monotonic() - start), 0.05))
        outcome = _wire.unpack_hello(recv_exact(conn, _wire.HELLO_SIZE, peer=f"{who} (its hello)"), ctx.size,
                                      ctx.group_id, nonce)
    except (OSError, ValueError, ProcGroupError) as exc:
        outcome = exc
    pending.discard(conn)
    arrivals.put((conn, who, outcome))


def _connect_to(ctx: ChannelContext, key: bytes, peer: int, deadline: float) -> socket.socket:
    remaining = max(deadline - time.monotonic(), 0.1)
    addr = ctx.store.get(f"tcp/addr/{peer}", timeout=remaining).decode()
    host, port, nonce_hex = addr.rsplit(":", 2)
    nonce = bytes.fromhex(nonce_hex)
    gr = ctx.global_rank(peer)
    last: OSError | None = None
    while time.monotonic() < deadline:
        if ctx.abort is not None:  # shrink: a member died (maybe this one), give up at once
            ctx.abort()
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(deadline - time.monotonic(), 0.1))
        except OSError as exc:
            last = exc
            time.sleep(0.05)
            continue
        try:
            client_handshake(sock, key, _purpose(ctx, nonce), f"rank {gr} at {host}:{port}",
                             min(HANDSHAKE_TIMEOUT_S * 2, max(deadline - time.monotonic(), 0.1)))
            sock.sendall(_wire.pack_hello(ctx.rank, ctx.size, ctx.group_id, nonce))
            return sock
        except BaseException:
            sock.close()
            raise
    raise CommTimeoutError(f"tcp: could not connect to rank {gr} at {host}:{port} within {ctx.timeout}s: {last}",
                           op="init", ranks=[gr])


class Peer:
    """One remote rank: its socket, an ordered send path, and the frames it sends.

    Frames between one pair never overtake each other: each direction is one TCP
    stream, and sends are serialised by the send lock, behind any queued sends. Who
    reads the frames (a waiting caller, or this peer's reader thread while none does)
    is decided by ``reader.gate`` and the channel's :class:`~procgroup_tcp._progress.Engine`.
    """

    def __init__(self, rank: int, global_rank: int, sock: socket.socket, timeout: float,
                 events: PeerEvents, engine: Engine | None = None) -> None:
        self.rank = rank
        self.global_rank = global_rank
        self.sock = sock
        self.fileno = sock.fileno()
        self.timeout = timeout
        self.events = events
        self.engine = engine if engine is not None else Engine()
        self.state = PeerState.OPEN
        self._state_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queued = 0
        self._sender: concurrent.futures.ThreadPoolExecutor | None = None
        self._seq_out = 0
        self._reader = threading.Thread(target=self.engine.background, args=(self,),
                                        name=f"procgroup-tcp-recv-{global_rank}", daemon=True)
        self._send_error: BaseException | None = None
        self._sendmsg = sock.sendmsg
        self.reader = FrameReader(self, sock, events)

    def start_reader(self) -> None:
        self._reader.start()

    # ------------------------------------------------------------------ its life
    def become(self, new: PeerState) -> bool:
        """Move to ``new`` if the state table allows it from the present state (under a
        lock: the reader thread and a closing caller may race); False when refused."""
        with self._state_lock:
            if new not in TRANSITIONS[self.state]:
                return False
            self.state = new
            return True

    @property
    def left(self) -> bool:
        """The peer said goodbye."""
        return self.state.left

    @property
    def over(self) -> bool:
        """Nothing more will be read from the peer (goodbye, EOF, a broken stream, closed)."""
        return self.state.over

    @property
    def closing(self) -> bool:
        """This rank is closing the connection."""
        return self.state.closing

    # ------------------------------------------------------------------ sending
    @property
    def has_queued_sends(self) -> bool:
        return self._queued > 0

    def send(self, view: memoryview, tag: int, dtype_char: bytes, fp: bytes = _wire.NO_FP) -> None:
        """Blocking send on the caller's thread; goes behind queued sends, keeping order."""
        if self._queued:
            self.send_async(view, tag, dtype_char, fp).result()
            return
        self._write(view, tag, dtype_char, fp)

    def send_async(self, view: memoryview, tag: int, dtype_char: bytes, fp: bytes = _wire.NO_FP,
                   kind: int = _wire.KIND_DATA) -> concurrent.futures.Future[None]:
        """Queue a send on this peer's sender thread (started on first use)."""
        with self._queue_lock:
            if self._sender is None:
                self._sender = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix=f"procgroup-tcp-send-{self.global_rank}")
            self._queued += 1
        fut = self._sender.submit(self._write, view, tag, dtype_char, fp, kind)
        fut.add_done_callback(self._dequeue)
        return fut

    def _dequeue(self, _: Any) -> None:
        with self._queue_lock:
            self._queued -= 1

    def _write(self, view: memoryview, tag: int, dtype_char: bytes, fp: bytes = _wire.NO_FP,
               kind: int = _KIND_DATA) -> None:
        if self._send_error is not None:
            raise fresh(self._send_error)
        with self._send_lock:
            header = _pack_header(kind, dtype_char, _MAGIC, 0, tag, self._seq_out, view.nbytes, fp)
            self._seq_out += 1
            try:
                try:
                    sent = self._sendmsg((header, view), (), _DONTWAIT)
                except BlockingIOError:
                    sent = 0
                if sent != _HEADER_SIZE + view.nbytes:
                    self._send_blocked(header, view, sent)
            except OSError as exc:
                raise self._send_failed(exc) from None

    def _send_blocked(self, header: bytes, view: memoryview, sent: int) -> None:
        """The kernel took only ``sent`` bytes: the rest goes out blocking, and every reader
        thread of the channel reads meanwhile (the peer may be sending to us as well)."""
        self.engine.send_blocks()
        try:
            _send_rest(self.sock, [memoryview(header), view], sent, self.timeout)
        finally:
            self.engine.send_unblocks()

    def _send_failed(self, exc: OSError) -> BaseException:
        """A write failed (under the send lock): the stream cannot be trusted any more."""
        if isinstance(exc, TimeoutError):  # part of the frame may be out
            self.events.peer_failed(self, PeerError(
                f"rank {self.global_rank} stopped reading: a send to it timed out after {self.timeout}s",
                rank=self.global_rank))
            return CommTimeoutError(
                f"send to rank {self.global_rank} timed out after {self.timeout}s (it is not reading)",
                op="send", ranks=[self.global_rank])
        known = self.events.known_failure()
        lost = PeerError(f"rank {self.global_rank} is unreachable: connection lost while sending ({exc})",
                         rank=self.global_rank)
        self.events.peer_failed(self, lost)
        # a channel broken by an earlier death: that death is the cause (this peer may have
        # seen it too and left at once), so the caller hears of it, not of this write
        return lost if known is None else fresh(known)

    def send_notice(self, body: bytes, kind: int, wait: float = 1.0) -> None:
        """Write a small control frame now, on the caller's thread, even after sends were
        failed: a lost-peer notice must be out before this process may exit. Best effort."""
        if not self._send_lock.acquire(timeout=wait):
            return
        try:
            header = _wire.pack_header(kind, b"B", 0, self._seq_out, len(body), _wire.NO_FP)
            self._seq_out += 1
            _send_all(self.sock, header, memoryview(body), max(wait, 1.0), self.engine)
        except OSError:
            pass  # that peer is gone too; whoever reads it next reports it
        finally:
            self._send_lock.release()

    def send_heartbeat(self) -> None:
        """Tell the peer this rank is alive; the heartbeat thread must never block on a
        peer that stopped reading (nor behind a long send)."""
        self._send_header_now(_wire.KIND_HEARTBEAT, 0, _wire.NO_FP)

    def send_probe(self, tag: int, fp: bytes) -> None:
        """Tell the peer this rank waits in the collective of ``tag`` under ``fp``; a
        waiting receiver sends it and must never block on it."""
        self._send_header_now(_wire.KIND_PROBE, tag, fp)

    def _send_header_now(self, kind: int, tag: int, fp: bytes) -> None:
        """A header-only frame, only if the socket takes it now; skipped while a send is
        under way (the peer hears from us anyway)."""
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            if not select.select([], [self.sock], [], 0)[1]:
                return
            header = _wire.pack_header(kind, b"B", tag, self._seq_out, 0, fp)
            self._seq_out += 1
            _send_all(self.sock, header, memoryview(b""), self.timeout)
        except (OSError, ValueError):
            pass  # whoever reads it next reports a broken connection
        finally:
            self._send_lock.release()

    def kill(self) -> None:
        """Cut the connection to a peer declared dead (it learns it was excluded, and a
        send blocked on it ends)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def fail_pending_sends(self, exc: BaseException) -> None:
        self._send_error = exc

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Say goodbye (unless the peer is gone) and close the socket."""
        self.become(PeerState.CLOSING)
        # a sender stuck on a dead peer must not hold up teardown for long
        # a broken channel still says goodbye to the live: they must not count this rank dead
        if not self.state.left and self._send_lock.acquire(timeout=1.0):
            try:
                _send_all(self.sock, _wire.pack_header(_wire.KIND_GOODBYE, b"B", 0, self._seq_out, 0),
                          memoryview(b""), 1.0)
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


__all__ = ["Landing", "Peer", "PeerEvents", "PeerState", "connect_mesh", "left_error"]
