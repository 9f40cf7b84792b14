"""The tcp backend's own collectives over the sockets, where they beat the generic ones.

Built on the channel's public point-to-point calls only (isend/irecv of
:class:`procgroup.backend.DataChannel`), so this layer sits above the connections and
the matching and below the channel. Ranks on one host never get here for all_reduce:
the channel runs it in shared memory (see ``_shm``).

Large all_reduce: the ring of ``procgroup.algorithms.ring`` with every step cut into
segments. All receives of a step are posted at once, so the reader thread lands
segment k+1 while this thread reduces segment k, and the sender thread streams our
outgoing chunk at the same time: network, reduction and sending overlap.
"""

from __future__ import annotations

import numpy as np
from procgroup.algorithms import ring
from procgroup.backend import DataChannel
from procgroup.ops import ReduceOp, finish_average, reduce_into

#: Segment size of the pipelined ring; big enough to amortise a frame, small enough to overlap.
SEGMENT_BYTES = 1 << 20
#: Below this the generic recursive doubling wins (fewer, latency-bound rounds).
PIPELINE_MIN_BYTES = ring.SMALL_ALL_REDUCE_BYTES + 1


def _segments(arr: np.ndarray, seg_elems: int) -> list[np.ndarray]:
    return [arr[i : i + seg_elems] for i in range(0, arr.size, seg_elems)] if arr.size else [arr]


def pipelined_ring_all_reduce(ch: DataChannel, array: np.ndarray, op: ReduceOp, tag: int) -> None:
    """Reduce-scatter then all-gather around the ring, each step in SEGMENT_BYTES pieces."""
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


__all__ = ["PIPELINE_MIN_BYTES", "SEGMENT_BYTES", "pipelined_ring_all_reduce"]
