"""TcpChannel: procgroup's default DataChannel, over one TCP connection per peer pair.

Each rank binds port 0 on the chosen interface and publishes ``host:port`` through the
Store (no port races); higher ranks connect to lower ones. A reader thread per peer
parses frames and lands each payload with ``recv_into`` straight in the buffer of a
posted receive, or in a buffer of its own when none is posted yet (the unexpected
queue). Frames between one pair never overtake each other, because each direction is
one TCP stream and sends to a peer are serialised by that peer's send lock/queue.

A peer whose connection drops without a goodbye frame breaks the channel: every
pending and later call raises :class:`~procgroup.errors.PeerError` naming that rank.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import numpy as np

from procgroup._netif import choose_address
from procgroup.channel import ChannelContext, CompletedWork, DataChannel, FutureWork, Work
from procgroup.errors import (
    ChannelClosedError,
    CommTimeoutError,
    InvalidArrayError,
    PeerError,
)
from procgroup.ops import ReduceOp

from . import _collectives
from ._conn import Peer, connect_mesh, fresh, left_error
from ._shm import SharedMemoryArena, host_identity, shm_possible

log = logging.getLogger(__name__)

#: isend of at most this many bytes is written inline (the kernel buffer absorbs it).
INLINE_SEND_BYTES = 256 * 1024


def byte_view(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous NumPy array (writable if it is), no copy."""
    return memoryview(array.reshape(-1).view(np.uint8))


_DTYPE_CODES: dict[np.dtype, bytes] = {}


def dtype_code(dtype: np.dtype) -> bytes:
    """The one-byte dtype code a frame header carries (cached: it is on every send)."""
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = dtype.char.encode()
    return code


class _PostedRecv:
    """A receive waiting for a matching frame; filled by a peer's reader thread."""

    __slots__ = ("view", "src", "tag", "dtype", "done", "sender", "error", "matched")

    def __init__(self, view: memoryview, src: int | None, tag: int, dtype: np.dtype) -> None:
        self.view = view
        self.src = src
        self.tag = tag
        self.dtype = dtype
        self.done = threading.Event()
        self.sender = -1
        self.error: BaseException | None = None
        self.matched = False

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        self.sender = sender
        self.error = error
        self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.finish(-1, error)


class _Unexpected:
    """A frame that arrived before its receive was posted; its payload is kept here."""

    __slots__ = ("src", "tag", "data", "dtype_char", "done", "error")

    def __init__(self, src: int, tag: int, nbytes: int, dtype_char: bytes) -> None:
        self.src = src
        self.tag = tag
        self.data = np.empty(nbytes, dtype=np.uint8)  # not zero-filled: it is overwritten
        self.dtype_char = dtype_char
        self.done = threading.Event()
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


class _RecvWork(Work):
    op = "irecv"

    def __init__(self, channel: "TcpChannel", req: _PostedRecv) -> None:
        self._channel = channel
        self._req = req

    def is_completed(self) -> bool:
        return self._req.done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        self._channel._wait_posted(self._req, timeout)
        return True

    def exception(self) -> BaseException | None:
        return self._req.error if self._req.done.is_set() else None

    def result(self) -> Any:
        return self._req.sender if self._req.done.is_set() and self._req.error is None else None


class TcpChannel(DataChannel):
    """The tcp backend's communicator; see the module docstring for the protocol."""

    backend_name = "tcp"

    def __init__(self, ctx: ChannelContext) -> None:
        super().__init__(ctx)
        self._lock = threading.Lock()
        self._posted: list[_PostedRecv] = []
        self._unexpected: list[_Unexpected] = []
        self._broken: BaseException | None = None
        self._peers: dict[int, Peer] = {}
        self._shm: SharedMemoryArena | None = None
        if ctx.size == 1:
            return
        address = choose_address(ctx.master_addr, ctx.options.get("ifname"))
        sockets = connect_mesh(ctx, address)
        for rank, sock in sockets.items():
            self._peers[rank] = Peer(rank, ctx.global_rank(rank), sock, ctx.timeout, self)
        try:
            for peer in self._peers.values():
                peer.start_reader()
            # option shm=False: a channel whose collectives never run here (gloo's side channel)
            if ctx.options.get("shm", True) and self._all_on_one_host():
                self._shm = SharedMemoryArena.open(self)  # None: /dev/shm refused, sockets it is
        except BaseException:
            self.close()
            raise

    def _all_on_one_host(self) -> bool:
        """Collective: every rank shares this host and can use shared memory."""
        me = f"{host_identity()}|{'shm' if shm_possible() else 'no-shm'}"
        self.ctx.store.set(f"tcp/host/{self.rank}", me)
        ids = {self.ctx.store.get(f"tcp/host/{r}", timeout=self.timeout).decode() for r in range(self.size)}
        return len(ids) == 1 and me.endswith("|shm")

    def peer_has_left(self, rank: int) -> bool:
        """The peer said goodbye (destroy_process_group); the shm waits ask this."""
        peer = self._peers.get(rank)
        return peer is not None and peer.left

    def shm_failed(self, exc: BaseException) -> None:
        """A shared-memory op was interrupted: its counters are out of step, so break."""
        with self._lock:
            if self._closed or self._broken is not None:
                return
            self._broken = PeerError(
                f"a shared-memory collective was interrupted ({type(exc).__name__}: {exc}); "
                f"this group cannot be used any more")
        log.error("procgroup tcp: %s", self._broken)

    @property
    def failure(self) -> BaseException | None:
        """The error that broke the channel (a peer died), or None while it is healthy."""
        return self._broken

    # ---------------------------------------------------------------- helpers
    def _peer(self, rank: int) -> Peer:
        self._raise_if_unusable()
        peer = self._peers.get(rank)
        if peer is None:
            raise PeerError(f"rank {self.ctx.global_rank(rank)} is not a peer of this channel", rank=rank)
        if peer.left:
            raise left_error(peer.global_rank)
        return peer

    def _raise_if_unusable(self) -> None:
        if self._closed:
            raise ChannelClosedError("the tcp channel is closed (destroy_process_group was called)")
        if self._broken is not None:
            raise fresh(self._broken)

    # ---------------------------------------------------------------- called by readers
    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes) -> _PostedRecv | _Unexpected:
        """Find the posted receive a frame belongs to, or queue it as unexpected."""
        with self._lock:
            for i, req in enumerate(self._posted):
                if req.tag == tag and (req.src is None or req.src == src):
                    del self._posted[i]
                    req.matched = True
                    return req
            ux = _Unexpected(src, tag, nbytes, dtype_char)
            self._unexpected.append(ux)
            return ux

    def peer_left(self, peer: Peer) -> None:
        """A goodbye frame: fail receives that wait on that peer alone."""
        exc = left_error(peer.global_rank)
        with self._lock:
            waiting = [r for r in self._posted if r.src == peer.rank]
            self._posted = [r for r in self._posted if r.src != peer.rank]
        for req in waiting:
            req.finish(peer.rank, exc)

    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        """A connection dropped without goodbye: break the channel for every caller."""
        with self._lock:
            if self._closed or self._broken is not None:
                return
            self._broken = exc
            posted, self._posted = self._posted, []
            pending = [u for u in self._unexpected if not u.done.is_set()]
        log.error("procgroup tcp: %s", exc)
        for req in posted:
            req.finish(peer.rank, exc)
        for ux in pending:
            ux.error = exc
            ux.done.set()
        for other in self._peers.values():
            other.fail_pending_sends(exc)
            other.fail_current(exc)

    # ---------------------------------------------------------------- point to point
    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        peer = self._peer(dst)
        peer.send(byte_view(array), tag, dtype_code(array.dtype))

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        peer = self._peer(dst)
        view = byte_view(array)
        dtype_char = dtype_code(array.dtype)
        if view.nbytes <= INLINE_SEND_BYTES and not peer.has_queued_sends:
            peer.send(view, tag, dtype_char)
            return CompletedWork("isend")
        return FutureWork("isend", peer.send_async(view, tag, dtype_char))

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        work = self.irecv(array, src, tag)
        work.wait()
        return int(work.result())

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        self._raise_if_unusable()
        peer = None if src is None else self._peers.get(src)
        if src is not None and peer is None:
            raise PeerError(f"rank {self.ctx.global_rank(src)} is not a peer of this channel", rank=src)
        req = _PostedRecv(byte_view(array), src, tag, array.dtype)
        with self._lock:
            for i, ux in enumerate(self._unexpected):
                if ux.tag == tag and (src is None or ux.src == src):
                    del self._unexpected[i]
                    break
            else:
                ux = None
                self._raise_if_unusable()  # again, now that peer_failed cannot interleave
                # what a departed peer sent before its goodbye is still delivered above
                if peer is not None and peer.left:
                    raise left_error(peer.global_rank)
                self._posted.append(req)
        if ux is None:
            return _RecvWork(self, req)
        self._deliver_unexpected(ux, req)
        return CompletedWork("irecv", ux.src)

    def _deliver_unexpected(self, ux: _Unexpected, req: _PostedRecv) -> None:
        if not ux.done.wait(self.timeout):
            raise CommTimeoutError(
                f"message from rank {self.ctx.global_rank(ux.src)} did not finish arriving within {self.timeout}s",
                op="recv", ranks=[self.ctx.global_rank(ux.src)],
            )
        if ux.error is not None:
            raise fresh(ux.error)
        check_size(ux.data.nbytes, ux.dtype_char, req, self.ctx.global_rank(ux.src))
        req.view[:] = memoryview(ux.data)

    def _wait_posted(self, req: _PostedRecv, timeout: float | None) -> None:
        """Wait for a posted receive.

        A ``timeout`` given to Work.wait only bounds this wait: the receive stays posted
        and a later wait can still get it. Running out the channel's own timeout cancels
        the receive for good. A receive whose payload is already streaming in is not
        cancelled; its reader finishes it, or fails it if the peer dies.
        """
        limit = self.timeout if timeout is None else timeout
        if req.done.wait(limit):
            if req.error is not None:
                raise fresh(req.error)
            return
        who = "any rank" if req.src is None else f"rank {self.ctx.global_rank(req.src)}"
        ranks = [] if req.src is None else [self.ctx.global_rank(req.src)]
        exc = CommTimeoutError(f"recv from {who} (tag {req.tag}) timed out after {limit}s", op="recv", ranks=ranks)
        if timeout is not None:
            raise exc
        with self._lock:
            cancelled = req in self._posted
            if cancelled:
                self._posted.remove(req)
        if cancelled:
            req.finish(-1, exc)
            raise exc
        # matched: the reader is filling the buffer and bounds a stalled peer itself
        if not req.done.wait(self.timeout):
            raise exc
        if req.error is not None:
            raise fresh(req.error)

    # ---------------------------------------------------------------- collectives
    # Ranks on one host use the shared-memory arena; otherwise the core's algorithms
    # run over the sockets (all_reduce: a pipelined ring of our own).
    def all_reduce(self, array: Any, op: ReduceOp) -> None:
        tag = self.next_collective_tag()  # taken on every path, so the ranks' sequences agree
        if self._shm is not None and array.size:
            self._shm.all_reduce(array, op)  # the latency-critical case, dispatched first
            return
        _collectives.all_reduce(self, array, op, tag)

    def broadcast(self, array: Any, src: int) -> None:
        if self._shm is None:
            super().broadcast(array, src)
        elif array.size:
            self._shm.broadcast(array, src)

    def reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        if self._shm is None:
            super().reduce(array, dst, op)
        elif array.size:
            self._shm.reduce(array, dst, op)

    def all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        if self._shm is None:
            super().all_gather(output_list, array)
        elif array.size:
            self._shm.all_gather(list(output_list), array)

    def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        if self._shm is None:
            super().reduce_scatter(output, input_list, op)
        elif output.size:
            self._shm.reduce_scatter(output, list(input_list), op)

    def all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> None:
        if self._shm is None:
            super().all_to_all(output_list, input_list)
        elif input_list[0].size:
            self._shm.all_to_all(list(output_list), list(input_list))

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for peer in self._peers.values():
            peer.close()
        exc = ChannelClosedError("the tcp channel was closed while this call was pending")
        with self._lock:
            posted, self._posted = self._posted, []
        for req in posted:
            req.finish(-1, exc)
        for peer in self._peers.values():
            peer.fail_current(exc)
        self.shutdown_threads()
        if self._shm is not None:
            self._shm.close()


def check_size(nbytes: int, dtype_char: bytes, req: _PostedRecv, sender: int) -> None:
    """Refuse a frame whose size or dtype differs from the receive buffer, naming both."""
    try:
        sent: Any = np.dtype(dtype_char.decode())
    except (TypeError, ValueError, UnicodeDecodeError):
        sent = dtype_char
    if nbytes != req.view.nbytes or sent != req.dtype:
        raise InvalidArrayError(
            f"message from rank {sender} has {nbytes} bytes of dtype {sent} but the receive "
            f"buffer has {req.view.nbytes} bytes of dtype {req.dtype}; size and dtype must match"
        )



__all__ = ["TcpChannel", "byte_view"]

