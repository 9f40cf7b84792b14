"""The tcp backend's own collectives, where it beats the generic algorithms.

Ranks on one host never get here for all_reduce: the channel runs it in shared memory
(see ``_shm``).

Large all_reduce: the ring of ``procgroup.algorithms.ring`` with every step cut into
segments. All receives of a step are posted at once, so the reader thread lands
segment k+1 while this thread reduces segment k, and the sender thread streams our
outgoing chunk at the same time: network, reduction and sending overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from procgroup.algorithms import ring
from procgroup.ops import ReduceOp, finish_average, reduce_into

if TYPE_CHECKING:
    from .channel import TcpChannel

#: Segment size of the pipelined ring; big enough to amortise a frame, small enough to overlap.
SEGMENT_BYTES = 1 << 20


def all_reduce(ch: "TcpChannel", array: Any, op: ReduceOp, tag: int) -> None:
    """all_reduce over the sockets (the channel sends same-host ranks to shared memory first)."""
    if ch.size == 1 or array.size == 0:
        return
    if array.nbytes <= ring.SMALL_ALL_REDUCE_BYTES:
        ring.recursive_doubling_all_reduce(ch, array, op, tag)
    else:
        pipelined_ring_all_reduce(ch, array, op, tag)


def _segments(arr: np.ndarray, seg_elems: int) -> list[np.ndarray]:
    return [arr[i : i + seg_elems] for i in range(0, arr.size, seg_elems)] if arr.size else [arr]


def pipelined_ring_all_reduce(ch: "TcpChannel", array: np.ndarray, op: ReduceOp, tag: int) -> None:
    n, r = ch.size, ch.rank
    flat = array.reshape(-1)
    bounds = ring.chunk_bounds(flat.size, n)
    chunks = [flat[bounds[i] : bounds[i + 1]] for i in range(n)]
    seg = max(SEGMENT_BYTES // flat.itemsize, 1)
    tmp = np.empty(max(c.size for c in chunks), dtype=flat.dtype)
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (r - step) % n, (r - step - 1) % n
        target = chunks[recv_idx]
        incoming = _segments(tmp[: target.size], seg)
        recvs = [ch.irecv(s, left, tag) for s in incoming]
        sends = [ch.isend(s, right, tag) for s in _segments(chunks[send_idx], seg)]
        for work, part, dest in zip(recvs, incoming, _segments(target, seg)):
            work.wait()
            reduce_into(op, dest, part)
        for work in sends:
            work.wait()
    finish_average(op, chunks[(r + 1) % n], n)
    for step in range(n - 1):
        send_idx, recv_idx = (r + 1 - step) % n, (r - step) % n
        recvs = [ch.irecv(s, left, tag) for s in _segments(chunks[recv_idx], seg)]
        sends = [ch.isend(s, right, tag) for s in _segments(chunks[send_idx], seg)]
        for work in recvs + sends:
            work.wait()
