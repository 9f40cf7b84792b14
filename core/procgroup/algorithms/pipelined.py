"""Segmented, pipelined collectives for large arrays (tcp runs them over its sockets).

Built on a channel's public point-to-point calls only (``send``/``irecv``), so any
channel with those runs them. Each array is cut into segments of ``seg_bytes``; a
segment moves on as soon as it has arrived (and been reduced), so receiving,
reducing and sending overlap along the whole chain, and a rank's part of one step
overlaps the next step. Receives are posted a few steps ahead, so frames land in
place (or in ``scratch``) rather than on the unexpected queue. ``scratch`` is a
uint8 buffer the caller owns (the channel keeps one between calls: no page faults
per call); its size is given by :func:`scratch_bytes`.

Every function is deterministic across ranks: each element of an all_reduce is
reduced in one fixed order and the result is then copied, so every rank gets the
same bits. Which algorithm runs at which size is the backend's choice (tcp: its
``_collectives``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from procgroup.algorithms.ring import chunk_bounds
from procgroup.ops import ReduceOp, finish_average, reduce_into

if TYPE_CHECKING:
    from procgroup.backend import DataChannel, Work


def segments(arr: np.ndarray, seg_elems: int) -> list[np.ndarray]:
    """Consecutive views of at most ``seg_elems`` elements (one empty view for size 0)."""
    return [arr[i : i + seg_elems] for i in range(0, arr.size, seg_elems)] if arr.size else [arr]


def _typed(scratch: np.ndarray, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
    """``count`` elements of ``dtype`` from ``scratch``, starting at element ``offset``."""
    start = offset * dtype.itemsize
    return scratch[start : start + count * dtype.itemsize].view(dtype)


#: The pipelined ring posts its receives this many steps ahead of the step it works on,
#: so that frames from a left neighbour running ahead land in place (a frame that finds
#: no receive is queued in a fresh buffer and copied again); each reduce-scatter step
#: in flight lands in a scratch chunk of its own.
RING_STEPS_AHEAD = 3


def _ring_window(size: int) -> tuple[int, int]:
    """The ring's steps posted ahead, and the scratch chunks they need, on ``size`` ranks."""
    ahead = max(1, min(2 * (size - 1) - 1, RING_STEPS_AHEAD))
    return ahead, max(1, min(ahead + 1, size - 1))


def scratch_bytes(algorithm: str, array: np.ndarray, size: int) -> int:
    """Bytes of scratch ``algorithm`` needs for ``array`` on ``size`` ranks."""
    if algorithm == "pipelined_ring_all_reduce":
        return _ring_window(size)[1] * (-(-array.size // size)) * array.itemsize  # the steps in flight
    if algorithm == "pipelined_chain_reduce":
        return array.nbytes
    return 0


def pipelined_ring_all_reduce(
    ch: DataChannel,
    array: np.ndarray,
    op: ReduceOp,
    tag: int,
    scratch: np.ndarray,
    seg_bytes: int,
    prepare: Callable[[int], None] | None = None,
    finished: Callable[[int], None] | None = None,
) -> None:
    """Reduce-scatter then all-gather around the ring, streamed segment by segment.

    Step s < n-1 receives chunk (r-s-1) from the left and reduces it into ours; step
    n-1+t receives chunk (r-t), final, in place. Whatever step s produced is what step
    s+1 sends, so each segment goes right on once it is ready: a rank sends 2(n-1)/n of
    the array, and the all-gather overlaps the reduce-scatter. The caller's thread both
    sends (one segment at a time, see :class:`_Pump`) and reduces what has landed.

    Hooks, for chunk i of ``chunk_bounds(array.size, n)``: ``prepare(i)`` runs before chunk
    i is first read (sent or reduced into), so a caller can fill a chunk late (two levels:
    a host's contributions): when it must, or earlier, while the caller would otherwise
    wait for a segment with nothing to send; ``finished(i)`` runs once chunk i holds its
    final value (it may still be sent on: the hook may read it, not change it). Each runs
    once per chunk, in the orders :func:`ring_chunk_order` gives.
    """
    n, r = ch.size, ch.rank
    if n == 1 or array.size == 0:
        return
    flat = array.reshape(-1)
    bounds = chunk_bounds(flat.size, n)
    chunks = [flat[bounds[i] : bounds[i + 1]] for i in range(n)]
    widest = max(c.size for c in chunks)
    ahead, landings = _ring_window(n)
    tmp = [_typed(scratch, flat.dtype, widest, k * widest) for k in range(landings)]
    seg = max(seg_bytes // flat.itemsize, 1)
    right, left = (r + 1) % n, (r - 1) % n
    steps = 2 * (n - 1)

    def recv_index(s: int) -> int:
        return (r - s - 1) % n if s < n - 1 else (r - (s - n + 1)) % n

    def landing(s: int) -> np.ndarray:
        idx = recv_index(s)
        return tmp[s % landings][: chunks[idx].size] if s < n - 1 else chunks[idx]

    def arrivals(s: int) -> list[tuple[Work, np.ndarray, np.ndarray]]:
        parts = segments(landing(s), seg)
        return [
            (ch.irecv(part, left, tag), part, dest) for part, dest in zip(parts, segments(chunks[recv_index(s)], seg))
        ]

    unprepared = deque(ring_chunk_order(n, r)[0] if prepare is not None else ())

    def prepare_next() -> bool:
        """Prepare the next chunk in order; False when none is left."""
        if not unprepared or prepare is None:
            return False
        prepare(unprepared.popleft())
        return True

    def prepared(i: int) -> None:
        while i in unprepared:
            prepare_next()

    prepared(r)
    pump = _Pump(ch, right, tag, segments(chunks[r], seg), prepare_next if prepare is not None else None)
    # receives posted in step order (one tag, one source: they match in posting order);
    # step s+ahead is posted once step s-1 is done with its landing buffer
    window = deque(arrivals(s) for s in range(min(ahead, steps)))
    for s in range(steps):
        if s + ahead < steps:
            window.append(arrivals(s + ahead))
        posted = window.popleft()
        if s < n - 1:
            prepared(recv_index(s))
        for work, part, dest in posted:
            pump.until(work)
            if s < n - 1:
                reduce_into(op, dest, part)
                if s == n - 2:
                    finish_average(op, dest, n)
            if s + 1 < steps:
                pump.queue.append(dest)
        if finished is not None and s >= n - 2:
            finished(recv_index(s))
    pump.drain()


def ring_chunk_order(n: int, r: int) -> tuple[list[int], list[int]]:
    """For rank ``r`` of a ring of ``n``: the order in which :func:`pipelined_ring_all_reduce`
    first reads its chunks (its own, then the one each reduce-scatter step reduces into),
    and the order in which they become final."""
    first = [(r - s) % n for s in range(n)]
    final = [(r + 1) % n] + [(r - t) % n for t in range(n - 1)]
    return first, final


class _Pump:
    """Sends queued segments on the caller's thread, one blocking send at a time, while
    the reader threads land what comes in: two threads per rank, no sender hand-off. A
    send blocks only while the peer's kernel buffer is full, and the peer's reader
    always drains it, so two ranks pumping at each other cannot deadlock."""

    def __init__(self, ch: DataChannel, dst: int, tag: int, first: list[np.ndarray],
                 idle: Callable[[], bool] | None = None) -> None:
        self.ch, self.dst, self.tag = ch, dst, tag
        self.queue: deque[np.ndarray] = deque(first)
        #: work for the caller while it has nothing to send and ``work`` is not in yet
        #: (True when it did some)
        self.idle = idle

    def until(self, work: Work) -> None:
        """Send queued segments until ``work`` (a receive) has completed, then return."""
        queue, send, idle = self.queue, self.ch.send, self.idle
        while True:
            while queue and not work.is_completed():
                send(queue.popleft(), self.dst, self.tag)
            if idle is None or queue or work.is_completed() or not idle():
                break
        work.wait()

    def drain(self) -> None:
        queue, send = self.queue, self.ch.send
        while queue:
            send(queue.popleft(), self.dst, self.tag)


def pipelined_chain_broadcast(ch: DataChannel, array: np.ndarray, src: int, tag: int, seg_bytes: int) -> None:
    """``src``'s array down the chain src, src+1, ...; each rank forwards a segment as it lands.

    Every rank receives and sends the array once: the time is about one array's transfer
    plus (n-2) segments, where a binomial tree costs log2(n) transfers at the root.
    """
    n = ch.size
    if n == 1 or array.size == 0:
        return
    vr = (ch.rank - src) % n
    prev, nxt = (ch.rank - 1) % n, (ch.rank + 1) % n
    parts = segments(array.reshape(-1), max(seg_bytes // array.itemsize, 1))
    pump = _Pump(ch, nxt, tag, parts if vr == 0 else [])
    if vr != 0:
        recvs = [ch.irecv(part, prev, tag) for part in parts]
        for work, part in zip(recvs, parts):
            pump.until(work)
            if vr < n - 1:
                pump.queue.append(part)
    pump.drain()


def pipelined_chain_reduce(
    ch: DataChannel, array: np.ndarray, dst: int, op: ReduceOp, tag: int, scratch: np.ndarray, seg_bytes: int
) -> None:
    """Reduce toward ``dst`` along the chain dst+n-1 -> ... -> dst+1 -> dst, segment by segment.

    A rank adds its own segment to the partial sum arriving from behind it and passes
    it on; only ``dst``'s array changes. Each rank moves the array once, so the time is
    about one transfer plus one reduction, overlapped.
    """
    n = ch.size
    if n == 1 or array.size == 0:
        return
    vr = (ch.rank - dst) % n
    behind, ahead = (ch.rank + 1) % n, (ch.rank - 1) % n
    flat = array.reshape(-1)
    seg = max(seg_bytes // flat.itemsize, 1)
    mine = segments(flat, seg)
    pump = _Pump(ch, ahead, tag, mine if vr == n - 1 else [])  # the far end starts the chain
    if vr != n - 1:
        incoming = segments(_typed(scratch, flat.dtype, flat.size), seg)
        recvs = [ch.irecv(part, behind, tag) for part in incoming]
        for work, part, own in zip(recvs, incoming, mine):
            pump.until(work)
            if vr == 0:
                reduce_into(op, own, part)  # the root accumulates in place
                finish_average(op, own, n)
            else:
                reduce_into(op, part, own)  # a non-root's array stays as it was
                pump.queue.append(part)
    pump.drain()


class Scratch:
    """One reusable uint8 buffer per channel: large collectives need the same size again
    and again, and a fresh allocation costs page faults on every call."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self._buf: np.ndarray | None = None

    def get(self, nbytes: int) -> np.ndarray:
        """At least ``nbytes`` of scratch; kept for the next call when under ``keep_bytes``."""
        buf = self._buf
        if buf is not None and buf.nbytes >= nbytes:
            return buf
        fresh: np.ndarray[Any, np.dtype[np.uint8]] = np.empty(nbytes, dtype=np.uint8)
        if nbytes <= self.keep_bytes:
            self._buf = fresh
        return fresh

    def release(self) -> None:
        self._buf = None


__all__ = [
    "RING_STEPS_AHEAD",
    "Scratch",
    "pipelined_chain_broadcast",
    "pipelined_chain_reduce",
    "pipelined_ring_all_reduce",
    "ring_chunk_order",
    "scratch_bytes",
    "segments",
]
