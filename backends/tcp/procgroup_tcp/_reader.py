"""The read side of a peer's socket: frames out of one TCP stream, through a small buffer.

Each :class:`~procgroup_tcp._conn.Peer` owns one :class:`FrameReader`. Whoever holds
the reader's ``gate`` (``_progress``: a waiting caller, or the peer's reader thread)
calls :meth:`FrameReader.read_frame`, which reads one frame and
dispatches it: a data frame's payload lands where the layer above says (a posted
receive, the unexpected queue; ``PeerEvents.match_incoming``), or straight in a
caller's own unposted receive (``want``); the other kinds go to the channel as
events. Nothing here knows about receives or what a lost peer means.

Why a buffer: one ``recv`` of up to 64 KiB takes a small frame's header and payload
together (and any frames behind it), where reading the header and then the payload
would cost two system calls per message. Payloads are copied out of the buffer only for the part that came with a
header; the rest of a large payload is read straight into its destination
(``recv_into``, no copy). Rule: whole frames left in the buffer wake nobody (``poll``
sees only the kernel's data), so a caller letting go of the gate dispatches them, unless
the reader thread is parked, which takes them in before it polls again
(:meth:`FrameReader.let_go`); a partial frame is fine, its rest is still to come from
the kernel.
"""

from __future__ import annotations

import abc
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from procgroup.backend import MAX_CONTROL_BYTES
from procgroup.backend._recorder import waiting as _recorder_waiting
from procgroup.errors import CommTimeoutError, PeerError

from . import _wire
from ._peer_state import PeerState
from ._progress import FRAME, LANDED, NOTHING, OVER, TICK_S
from ._wire import check_size

if TYPE_CHECKING:
    from ._conn import Peer

_now = time.monotonic
_yield = getattr(os, "sched_yield", lambda: None)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_HEADER_SIZE = _wire.HEADER_SIZE
_KIND_DATA = _wire.KIND_DATA
_MAGIC = _wire.MAGIC
_unpack_from = _wire.HEADER.unpack_from
#: After a payload longer than this, its arrival counts as heard again (the heartbeat's watch).
_LONG_PAYLOAD = 1 << 20
#: A frame claiming more is a protocol error (256 TiB: no buffer is that large).
MAX_FRAME_BYTES = 1 << 48
#: The stream buffer: what one ``recv`` may take in (small frames, and a large one's head).
BUFFER_BYTES = 64 * 1024


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
    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes, fp: bytes) -> Landing:
        """Where the payload of a frame from ``src`` lands (``fp``: the sender's fingerprint)."""

    @abc.abstractmethod
    def mismatch_notice(self, peer: Peer, tag: int, notice: bytes) -> None:
        """``peer`` found that the ranks disagree on the collective of ``tag``."""

    @abc.abstractmethod
    def peer_lost_notice(self, peer: Peer, lost: int, reason: str) -> None:
        """``peer`` reports it lost world rank ``lost`` (the root cause of what follows)."""

    def peer_left_notice(self, peer: Peer, gone: int, reason: str) -> None:
        """``peer`` reports an op of its own failed because world rank ``gone`` left first."""

    def control_message(self, peer: Peer, body: bytes) -> None:
        """``peer`` sent a fault-tolerance control message (revoke, the agreement)."""

    def fingerprint_probe(self, peer: Peer, tag: int, fp: bytes) -> None:
        """``peer`` has waited a while to receive in the collective of ``tag``, under ``fp``."""

    @abc.abstractmethod
    def peer_left(self, peer: Peer) -> None:
        """``peer`` said goodbye (a clean close); what it sent before is delivered."""

    @abc.abstractmethod
    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        """``peer``'s connection broke without a goodbye."""

    def known_failure(self) -> BaseException | None:
        """The error the channel already broke with (a death seen earlier), else None."""
        return None


class _Direct:
    """``_current`` while a caller's unposted receive streams in: its reader is the waiting
    caller, who sees a failure itself, so failing it is a no-op."""

    def admit(self, nbytes: int, dtype_char: bytes, sender: int) -> memoryview:
        raise AssertionError("never matched")

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass


_DIRECT = _Direct()
_EMPTY = memoryview(b"")


class FrameReader:
    """The frames of one peer's socket, read by whoever holds ``gate``; owned by that
    :class:`~procgroup_tcp._conn.Peer`, whose life (``Peer.state``) it moves on when the
    stream ends (goodbye, EOF, a broken stream). Frames arrive in order (``seq``); a bad
    one breaks the stream."""

    def __init__(self, peer: Peer, sock: socket.socket, events: PeerEvents) -> None:
        self._peer = peer
        self.rank = peer.rank
        self.global_rank = peer.global_rank
        self.timeout = peer.timeout
        self.events = events
        self.sock = sock
        self.fileno = sock.fileno()
        # -- who reads (``_progress``): whoever reads holds ``gate`` for whole frames
        self.gate = threading.Lock()
        self.driven_at = 0.0  # when a waiting caller last read this peer
        self.parked = False  # the reader thread stands back (a caller reads this peer)
        self.spin = 0.0  # seconds a blocking read first watches the socket (``_spin_then_read``)
        # -- the stream
        self._seq_in = 0
        self._current: Landing | None = None  # where a reader is landing a payload now
        self.last_heard = _now()  # when a reader last saw a frame (the heartbeat's watch)
        self._buf = bytearray(BUFFER_BYTES)
        self._bview = memoryview(self._buf)
        self._start = 0  # the buffered, unread bytes are _buf[_start:_end]
        self._end = 0
        self._skip = 0  # bytes of a refused payload still to be read and dropped
        self._skip_since = 0.0
        self._recv_into = sock.recv_into
        self._match = events.match_incoming
        self._poller = select.poll()  # a driving caller's (under the gate), for short waits
        self._poller.register(sock, select.POLLIN)
        # a caller's unposted receive (``read_frame``'s ``want``), set under the gate
        self.direct: memoryview = _EMPTY
        self.direct_code = b""
        self.direct_dtype: Any = None
        self.refused: BaseException | None = None

    @property
    def over(self) -> bool:
        """Nothing more will be read: goodbye, EOF or a broken stream (``Peer.state``)."""
        return self._peer.state.over

    @property
    def receiving(self) -> bool:
        """A reader is in the middle of a payload (bytes are arriving)."""
        return self._current is not None

    def fail_current(self, exc: BaseException) -> None:
        """Fail the payload a reader is landing from this peer (it died or we close)."""
        target = self._current
        if target is not None:
            target.fail(exc)

    def wait_readable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for bytes (or EOF); the caller holds ``gate``."""
        if self._end - self._start >= _HEADER_SIZE:
            return True
        try:
            return bool(self._poller.poll(max(timeout * 1000.0, 0.0)))
        except (OSError, ValueError):
            return True  # closed: reading reports it

    @property
    def has_frame(self) -> bool:
        """A whole header is in the buffer (``poll`` does not see it: it is out of the kernel)."""
        return self._end - self._start >= _HEADER_SIZE

    def drain_buffered(self) -> None:
        """Dispatch the whole frames already in the buffer."""
        peer = self._peer
        while self._end - self._start >= _HEADER_SIZE and not peer.state.over:
            self.read_frame(False)

    def let_go(self) -> None:
        """A caller is about to let go of the gate. Whole frames it leaves in the buffer
        would wake nobody (``poll`` sees only the kernel's data), so they are dispatched
        now, unless the reader thread is parked: it takes them in, under the gate, before
        it polls again (``Engine._stand_back``), and a caller that comes back sooner reads
        them straight from the buffer, the next message landing in its array instead of
        going through the unexpected queue."""
        if self._end - self._start >= _HEADER_SIZE and not self.parked:
            self.drain_buffered()

    def receive_direct(self, into: memoryview, code: bytes, dtype: Any, tag: int,
                       check: Callable[[int], None]) -> None:
        """A caller's unposted receive of ``tag`` (``TcpChannel.do_recv``, which holds the
        gate and made sure no queued frame or earlier receive comes first): read frames
        until one of ``tag`` lands in ``into``. Whenever the tick passes with nothing, or
        the peer is over, ``check(rank)`` raises the channel's error (broken, closed, the
        peer left); the channel timeout ends the wait with CommTimeoutError."""
        self.direct, self.direct_code, self.direct_dtype, self.refused = into, code, dtype, None
        deadline = 0.0
        try:
            while True:
                got = self.read_frame(True, tag)
                if got == LANDED:
                    break
                if got == FRAME:
                    continue
                check(self.rank)
                if got == OVER:  # closed under us, or a failure the channel has recorded already
                    raise PeerError(f"the connection to rank {self.global_rank} is closed", rank=self.global_rank)
                now = _now()
                if not deadline:
                    deadline = now + self.timeout - TICK_S  # the first tick has passed
                elif now >= deadline:
                    raise CommTimeoutError(f"recv from rank {self.global_rank} (tag {tag}) timed out after "
                                           f"{self.timeout}s", op="recv", ranks=[self.global_rank])
        finally:
            self.direct = _EMPTY  # the caller's array is not kept alive
            self.let_go()
        if self.refused is not None:
            raise self.refused

    # ------------------------------------------------------------------ one frame
    def read_frame(self, wait: bool, want: int = -1) -> int:
        """Read one whole frame and dispatch it; the caller holds ``gate``.

        ``wait``: block for the frame's first bytes until the kernel's tick passes; else
        return NOTHING at once when none has come. Returns FRAME, NOTHING, or OVER when
        this peer will send no more (goodbye, EOF, or a broken stream, reported here).
        ``want``: the tag of the caller's own unposted receive (``TcpChannel.do_recv``):
        a data frame of that tag lands in ``direct`` without matching (LANDED; a frame of
        the wrong size or dtype is read and dropped, and its error left in ``refused``).
        On every message's path: kept flat (each Python call is a measurable share of it).
        """
        try:
            if self._skip and not self._skip_rest(wait):
                return NOTHING
            start, end = self._start, self._end
            if end - start < _HEADER_SIZE:
                if end == start:  # at a frame boundary with nothing buffered
                    try:
                        got = self._recv_into(self._bview, BUFFER_BYTES, 0 if wait and not self.spin else _DONTWAIT)
                    except (BlockingIOError, TimeoutError):  # nothing yet (MSG_DONTWAIT, or the tick)
                        self._start = self._end = 0
                        if not wait or not self.spin:
                            if wait:  # a tick passed with nothing: the caller's op is a slow one
                                _recorder_waiting()
                            return NOTHING
                        got = self._spin_then_read()
                        if got < 0:  # a tick passed with nothing: the caller's op is a slow one
                            _recorder_waiting()
                            return NOTHING
                    if got == 0:
                        if self._peer.state.closing:
                            self._peer.become(PeerState.CLOSED)
                            return OVER
                        raise self._closed_error()
                    start, end = 0, got
                if end - start < _HEADER_SIZE:  # part of a header: the rest is on its way
                    start, end = self._fill(start, end, _HEADER_SIZE)
            kind, dtype_char, magic, _, tag, seq, nbytes, fp = _unpack_from(self._buf, start)
            start += _HEADER_SIZE
            self._start, self._end = start, end
            if magic != _MAGIC:
                raise self._protocol(f"sent a bad frame magic {magic:#x}")
            if seq != self._seq_in:
                raise self._protocol(f"sent frame {seq} where {self._seq_in} was due")
            self._seq_in = seq + 1
            self.last_heard = _now()
            if kind == _KIND_DATA:
                if nbytes > MAX_FRAME_BYTES:
                    raise self._protocol(f"sent a frame claiming {nbytes} bytes")
                if tag == want:
                    into = self.direct
                    if nbytes != into.nbytes or dtype_char != self.direct_code:
                        try:
                            check_size(nbytes, dtype_char, into, self.direct_dtype, self.global_rank)
                        except Exception as exc:  # noqa: BLE001 - the receive's error; the stream stays in step
                            self.refused = exc
                            self._discard(nbytes)
                            return LANDED
                    self._land(into, _DIRECT, start, end, nbytes)
                    return LANDED
                target = self._match(self.rank, tag, nbytes, dtype_char, fp)
                try:
                    view = target.admit(nbytes, dtype_char, self.global_rank)
                except Exception as exc:  # noqa: BLE001 - reported to the receiver, stream kept in sync
                    target.finish(self.rank, exc)  # at once: the payload may be long (or never come)
                    self._discard(nbytes)
                    return FRAME
                if not self._land(view, target, start, end, nbytes) and nbytes > _LONG_PAYLOAD:
                    self.last_heard = _now()
                target.finish(self.rank)
            elif kind == _wire.KIND_HEARTBEAT and nbytes == 0:
                pass
            elif kind == _wire.KIND_GOODBYE:
                self._peer.become(PeerState.LEFT)
                self.events.peer_left(self._peer)
                return OVER
            elif kind == _wire.KIND_MISMATCH and nbytes == _wire.NOTICE_SIZE:
                self.events.mismatch_notice(self._peer, tag, self._read_body(nbytes))
            elif kind == _wire.KIND_PEER_LOST and _wire.LOST.size <= nbytes <= _wire.MAX_LOST_BYTES:
                lost, reason = _wire.unpack_lost(self._read_body(nbytes))
                self.events.peer_lost_notice(self._peer, lost, reason)
            elif kind == _wire.KIND_PEER_LEFT and _wire.LOST.size <= nbytes <= _wire.MAX_LOST_BYTES:
                gone, reason = _wire.unpack_lost(self._read_body(nbytes))
                self.events.peer_left_notice(self._peer, gone, reason)
            elif kind == _wire.KIND_PROBE and nbytes == 0:
                self.events.fingerprint_probe(self._peer, tag, fp)
            elif kind == _wire.KIND_CONTROL and nbytes <= MAX_CONTROL_BYTES:
                self.events.control_message(self._peer, self._read_body(nbytes))
            else:
                raise self._protocol(f"sent a frame of unknown kind {kind}, or of a size that kind cannot have "
                                     f"({nbytes} bytes)")
            return FRAME
        except Exception as exc:  # noqa: BLE001 - whatever stops the reading breaks the channel
            self._read_failed(exc)
            return OVER

    def _spin_then_read(self) -> int:
        """Nothing has come yet: watch the socket for ``spin`` seconds (``poll`` with no
        timeout: the bytes are taken as they arrive, with no sleep and no wake-up), then
        block until the tick. -1: none. The core is yielded between polls: a process
        sharing it (maybe the very sender; the host's other jobs count too) runs meanwhile,
        where a plain spin would keep it from the sender."""
        poll, end = self._poller.poll, _now() + self.spin
        while not poll(0):
            if _now() >= end:
                break
            _yield()
        try:
            return self._recv_into(self._bview, BUFFER_BYTES)
        except (BlockingIOError, TimeoutError):
            return -1

    # ------------------------------------------------------------------ payloads
    def _land(self, view: memoryview, landing: Landing, start: int, end: int, nbytes: int) -> bool:
        """A frame's payload into ``view``: copied from the buffer when it came with its
        header (the common small case: True), else read in with ``landing`` as the one
        being landed, so a failure meanwhile reaches it (False)."""
        if start + nbytes <= end:
            view[:] = self._bview[start:start + nbytes]
            self._start = start + nbytes
            return True
        self._current = landing
        self._take(view, nbytes)
        self._current = None
        return False

    def _take(self, view: memoryview, nbytes: int) -> None:
        """Fill ``view`` (``nbytes``): the buffered head, then the rest straight from the socket."""
        start, end = self._start, self._end
        have = min(end - start, nbytes)
        if have:
            view[:have] = self._bview[start:start + have]
        if start + have == end:
            self._start = self._end = 0
        else:
            self._start = start + have
        if have < nbytes:
            self._read_into(view[have:])

    def _discard(self, nbytes: int) -> None:
        """Drop a refused payload: the buffered part now, the rest as it arrives (whoever
        reads next skips it first), so the receive it failed returns at once."""
        have = min(self._end - self._start, nbytes)
        self._start += have
        if self._start == self._end:
            self._start = self._end = 0
        self._skip = nbytes - have
        self._skip_since = _now()

    def _skip_rest(self, wait: bool) -> bool:
        """Read and drop what is left of a refused payload; False while more is to come."""
        scratch = memoryview(bytearray(min(self._skip, 1 << 20)))
        while self._skip:
            try:
                n = self._recv_into(scratch, min(self._skip, scratch.nbytes), 0 if wait else _DONTWAIT)
            except (BlockingIOError, TimeoutError):
                self._stalled(self._skip_since)
                return False
            if n == 0:
                raise self._eof_mid_frame()
            self._skip -= n
            self._skip_since = _now()
        return True

    def _read_body(self, nbytes: int) -> bytes:
        body = bytearray(nbytes)
        self._take(memoryview(body), nbytes)
        return bytes(body)

    def _fill(self, start: int, end: int, need: int) -> tuple[int, int]:
        """Read until the buffer holds ``need`` bytes from ``start`` (moved to the front)."""
        view = self._bview
        if start:
            view[:end - start] = view[start:end]
            start, end = 0, end - start
        if end < need:
            end += self._read_at_least(view[end:BUFFER_BYTES], need - end)
        self._start, self._end = start, end
        return start, end

    def _read_into(self, view: memoryview) -> None:
        """Fill ``view`` from the socket, in the middle of a frame."""
        self._read_at_least(view, view.nbytes)

    def _read_at_least(self, view: memoryview, least: int) -> int:
        """Read into ``view`` until at least ``least`` bytes came (at most all of it), in
        the middle of a frame: a peer that sends nothing for longer than the timeout
        there, or closes, is reported (PeerError)."""
        got, room = 0, view.nbytes
        last = _now()
        while got < least:
            try:
                n = self._recv_into(view[got:], room - got)
            except (BlockingIOError, TimeoutError):  # the tick (or a closing socket's timeout)
                self._stalled(last)
                continue
            if n == 0:
                raise self._eof_mid_frame()
            got += n
            last = _now()
        return got

    # ------------------------------------------------------------------ failures
    def _stalled(self, since: float) -> None:
        if _now() - since > self.timeout:
            raise PeerError(f"rank {self.global_rank} stalled for {self.timeout}s in the middle of a message",
                            rank=self.global_rank)

    def _eof_mid_frame(self) -> PeerError:
        if self._peer.state.closing:
            return PeerError(f"the connection to rank {self.global_rank} was closed mid-message",
                             rank=self.global_rank)
        return self._closed_error()

    def _read_failed(self, exc: Exception) -> None:
        """The stream ended in error: the peer is broken (told to the channel), unless this
        rank is closing it (then the payload being landed fails, nothing more)."""
        peer = self._peer
        if peer.state.closing or not peer.become(PeerState.BROKEN):
            peer.become(PeerState.CLOSED)
            self.fail_current(PeerError(f"the connection to rank {self.global_rank} was closed",
                                        rank=self.global_rank))
            return
        reason = exc if isinstance(exc, PeerError) else PeerError(
            f"lost the connection to rank {self.global_rank}: {exc}", rank=self.global_rank)
        self.events.peer_failed(peer, reason)

    def _closed_error(self) -> PeerError:
        return PeerError(f"rank {self.global_rank} closed its connection without a goodbye "
                         f"(the process died or exited without destroy_process_group)", rank=self.global_rank)

    def _protocol(self, what: str) -> PeerError:
        """The peer broke the wire protocol: the stream cannot be trusted any more."""
        return PeerError(f"rank {self.global_rank} {what}: the stream is corrupt or not procgroup's; "
                         f"closing the connection to it", rank=self.global_rank)


__all__ = ["BUFFER_BYTES", "MAX_FRAME_BYTES", "FrameReader", "Landing", "PeerEvents"]
