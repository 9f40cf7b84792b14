"""Which algorithm runs a collective over the sockets, by size and world size.

Small arrays are latency-bound: the fewest rounds win (recursive doubling for
all_reduce, the binomial tree for broadcast and reduce, from ``procgroup.algorithms``).
Large arrays are bandwidth-bound: the segmented, pipelined ring and chains of
``procgroup.algorithms.pipelined`` move each byte the fewest times and overlap the network with the
reduction. The crossover sizes below were measured with ``bench/socket_thresholds.py``
(docs/performance.md has the tables that chose them); ``PROCGROUP_TCP_RING_MIN_BYTES``,
``PROCGROUP_TCP_CHAIN_MIN_BYTES`` and ``PROCGROUP_TCP_SEGMENT_BYTES`` override them.
Ranks on one host never get here for these ops: the channel runs them in shared memory.

On several hosts with several ranks on some of them (``Topology.two_level``) every
collective runs in two levels (``procgroup.algorithms.hierarchical``: the ranks of a host
through the channel's point-to-point, which is shared memory between them, and the
leaders between hosts with the flat choice below on their view); :class:`TwoLevel` holds
that choice. One rank per host, or one host, stays flat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from procgroup.algorithms import hierarchical, pipelined, ring, tree
from procgroup.algorithms.hierarchical import Topology
from procgroup.backend import DataChannel, env_bytes
from procgroup.ops import ReduceOp


#: all_reduce of at least this many bytes takes the pipelined ring, smaller ones recursive
#: doubling; by world size (the largest key not above the size applies). Doubling's
#: log2(n) exchanges win while a message's latency dominates, the ring's bandwidth once
#: the array is large; each threshold is where bench/socket_thresholds.py saw the winner
#: change (the runs: docs/history.md).
RING_MIN_BYTES = {2: 1 << 20, 3: 1 << 20, 4: 256 * 1024}
#: broadcast of at least this many bytes takes the segmented chain, smaller ones the
#: binomial tree: the chain pipelines segments along the ranks, so a large array costs
#: about one pass over the slowest link however many hops there are (ranks on one host
#: use the shared-memory arena, not this path).
BROADCAST_CHAIN_MIN_BYTES = {2: 1 << 20, 3: 2 << 20}
#: reduce: the chain from this size, for the broadcast's reason.
REDUCE_CHAIN_MIN_BYTES = {2: 2 << 20, 3: 256 * 1024}
#: The segment of the pipelines on two ranks: big enough to amortise a frame, small
#: enough for sending, receiving and reducing to overlap.
SEGMENT_BYTES = 1 << 20
#: On three or more ranks a pipeline keeps several segments in flight per stage (a ring
#: step's chunk in RING_SEGMENTS_PER_CHUNK, a chain's array in CHAIN_SEGMENTS_PER_HOP per
#: hop), each from MIN_SEGMENT_BYTES to MULTI_SEGMENT_BYTES: the longer the pipeline, the
#: smaller its segments must be for every link to stay busy, down to where a frame's fixed
#: cost dominates (the runs on 4 and 8 simulated hosts: docs/history.md).
MULTI_SEGMENT_BYTES = 256 * 1024
MIN_SEGMENT_BYTES = 128 * 1024
RING_SEGMENTS_PER_CHUNK = 2
CHAIN_SEGMENTS_PER_HOP = 2
#: Scratch kept between calls per channel (larger needs are allocated per call).
SCRATCH_KEEP_BYTES = 256 << 20
#: Two levels: all_reduce of at least this many bytes is cut into one slice per local rank
#: (each local rank leads one between hosts: every core and the link work at once);
#: smaller ones take one leader per host, since a message's latency, not its bytes,
#: dominates and one between-host exchange of the whole array costs the fewest rounds.
SLICED_MIN_BYTES = 512 * 1024
#: Two levels: from slices of this many bytes (and where the flat plan would take the
#: ring between hosts), each leader's slice goes round one between-host ring whole, its
#: host's traffic riding on the ring's chunks (``hierarchical.sliced_ring_all_reduce``):
#: no pipeline restarts per piece, and the host stage overlaps the ring but for one
#: chunk at each end. Below it the per-chunk host messages and the ring's stalls while a
#: chunk is prepared cost more than they hide: the pieces of PIECE_BYTES.
STREAMED_MIN_BYTES = 8 << 20
#: Two levels: a leader moves its part in pieces of this size, so that its host's traffic
#: for the next piece overlaps the between-host step of this one. Each piece's
#: between-host step is a whole flat pipeline that fills and drains, so pieces are large:
#: the host's traffic is far cheaper than the link's, and a few pieces hide it.
PIECE_BYTES = 16 << 20


def _by_size(table: dict[int, int], size: int) -> int:
    return table[max(k for k in table if k <= size)] if size >= min(table) else table[min(table)]


class Plan:
    """The thresholds one channel uses (read once, at channel creation)."""

    def __init__(self) -> None:
        self.ring_min = env_bytes("PROCGROUP_TCP_RING_MIN_BYTES", None)
        self.chain_min = env_bytes("PROCGROUP_TCP_CHAIN_MIN_BYTES", None)
        seg = env_bytes("PROCGROUP_TCP_SEGMENT_BYTES", None, minimum=1, hint="a segment needs at least one")
        #: set by hand: every pipeline uses exactly this segment
        self.segment_fixed = seg is not None
        self.segment = seg or SEGMENT_BYTES
        self.scratch = pipelined.Scratch(SCRATCH_KEEP_BYTES)

    def use_ring(self, nbytes: int, size: int) -> bool:
        limit = self.ring_min if self.ring_min is not None else _by_size(RING_MIN_BYTES, size)
        return nbytes >= limit

    def use_chain(self, table: dict[int, int], nbytes: int, size: int) -> bool:
        limit = self.chain_min if self.chain_min is not None else _by_size(table, size)
        return nbytes >= limit

    def segment_for(self, size: int, stage_bytes: int, pieces: int) -> int:
        """The segment for a pipeline stage of ``stage_bytes`` that should travel in at
        least ``pieces`` segments. Two ranks keep SEGMENT_BYTES: their pipeline has one hop
        and no gaps between steps to hide, and on one host a finer cut only costs CPU. A segment set by hand
        (PROCGROUP_TCP_SEGMENT_BYTES) is used as it is."""
        if self.segment_fixed or size <= 2:
            return self.segment
        return min(MULTI_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, -(-stage_bytes // pieces)))

    def ring_segment(self, nbytes: int, size: int) -> int:
        return self.segment_for(size, -(-nbytes // size), RING_SEGMENTS_PER_CHUNK)

    def chain_segment(self, nbytes: int, size: int) -> int:
        return self.segment_for(size, nbytes, CHAIN_SEGMENTS_PER_HOP * (size - 1))

    # ---------------------------------------------------------------- the collectives
    # each takes the collective's private tag, drawn by the dispatcher (``_dispatch``)
    def all_reduce(self, ch: DataChannel, array: np.ndarray, op: ReduceOp, tag: int) -> None:
        if ch.size == 1 or array.size == 0:
            return
        if self.use_ring(array.nbytes, ch.size):
            scratch = self.scratch.get(pipelined.scratch_bytes("pipelined_ring_all_reduce", array, ch.size))
            pipelined.pipelined_ring_all_reduce(ch, array, op, tag, scratch, self.ring_segment(array.nbytes, ch.size))
        else:
            ring.recursive_doubling_all_reduce(ch, array, op, tag)

    def broadcast(self, ch: DataChannel, array: np.ndarray, src: int, tag: int) -> None:
        if self.use_chain(BROADCAST_CHAIN_MIN_BYTES, array.nbytes, ch.size):
            pipelined.pipelined_chain_broadcast(ch, array, src, tag, self.chain_segment(array.nbytes, ch.size))
        else:
            tree.broadcast(ch, array, src, tag)

    def reduce(self, ch: DataChannel, array: np.ndarray, dst: int, op: ReduceOp, tag: int) -> None:
        if self.use_chain(REDUCE_CHAIN_MIN_BYTES, array.nbytes, ch.size):
            scratch = self.scratch.get(pipelined.scratch_bytes("pipelined_chain_reduce", array, ch.size))
            pipelined.pipelined_chain_reduce(ch, array, dst, op, tag, scratch, self.chain_segment(array.nbytes, ch.size))
        else:
            tree.reduce(ch, array, dst, op, tag)

    def _chain(self, table: dict[int, int], size: int) -> int:
        return self.chain_min if self.chain_min is not None else _by_size(table, size)

    def describe(self, size: int) -> dict[str, Any]:
        """The thresholds in force for a channel of ``size`` ranks (for logs and docs)."""
        return {
            "ring_min_bytes": self.ring_min if self.ring_min is not None else _by_size(RING_MIN_BYTES, size),
            "broadcast_chain_min_bytes": self._chain(BROADCAST_CHAIN_MIN_BYTES, size),
            "reduce_chain_min_bytes": self._chain(REDUCE_CHAIN_MIN_BYTES, size),
            "segment_bytes": self.segment,
            "segment_fixed": self.segment_fixed,
            "multi_segment_bytes": self.segment if self.segment_fixed else MULTI_SEGMENT_BYTES,
        }


class TwoLevel:
    """The two-level collectives of one channel: ``procgroup.algorithms.hierarchical``
    with ``plan``'s flat algorithms between hosts, and a scratch buffer of its own for
    what a leader receives from its host (the flat pipelines use ``plan.scratch`` at the
    same time)."""

    def __init__(self, plan: Plan, options: Mapping[str, Any] | None = None) -> None:
        self.plan = plan
        self.piece = env_bytes("PROCGROUP_TCP_PIECE_BYTES", None, minimum=1, name="piece_bytes", options=options,
                               hint="a piece needs at least one") or PIECE_BYTES
        self.streamed_min: int = env_bytes("PROCGROUP_TCP_STREAMED_MIN_BYTES", STREAMED_MIN_BYTES,
                                           name="streamed_min_bytes", options=options) or 0
        self.scratch = pipelined.Scratch(SCRATCH_KEEP_BYTES)

    def slices(self, topo: Topology, nbytes: int) -> int:
        return topo.min_per_host if nbytes >= SLICED_MIN_BYTES else 1

    def all_reduce(self, ch: DataChannel, topo: Topology, array: np.ndarray, op: ReduceOp, tag: int) -> None:
        slices = self.slices(topo, array.nbytes)
        part = array.nbytes // slices
        streamed = part >= self.streamed_min and self.plan.use_ring(part, len(topo.hosts))
        if array.nbytes >= SLICED_MIN_BYTES and streamed:
            hierarchical.sliced_ring_all_reduce(ch, topo, array, op, tag, slices, self._ring, self.scratch.get)
        else:
            hierarchical.all_reduce(ch, topo, array, op, tag, slices, self.piece, self.plan.all_reduce,
                                    self.scratch.get)

    def _ring(self, view: Any, array: np.ndarray, op: ReduceOp, tag: int, prepare: Callable[[int], None],
              finished: Callable[[int], None]) -> None:
        """The between-host ring of a sliced all_reduce: the flat plan's pipelined ring."""
        plan = self.plan
        scratch = plan.scratch.get(pipelined.scratch_bytes("pipelined_ring_all_reduce", array, view.size))
        pipelined.pipelined_ring_all_reduce(view, array, op, tag, scratch, plan.ring_segment(array.nbytes, view.size),
                                            prepare, finished)

    def broadcast(self, ch: DataChannel, topo: Topology, array: np.ndarray, src: int, tag: int) -> None:
        hierarchical.broadcast(ch, topo, array, src, tag, self.piece, self.plan.broadcast)

    def reduce(self, ch: DataChannel, topo: Topology, array: np.ndarray, dst: int, op: ReduceOp, tag: int) -> None:
        hierarchical.reduce(ch, topo, array, dst, op, tag, self.piece, self.plan.reduce, self.scratch.get)


__all__ = [
    "BROADCAST_CHAIN_MIN_BYTES",
    "PIECE_BYTES",
    "SLICED_MIN_BYTES",
    "STREAMED_MIN_BYTES",
    "TwoLevel",
    "REDUCE_CHAIN_MIN_BYTES",
    "RING_MIN_BYTES",
    "CHAIN_SEGMENTS_PER_HOP",
    "MIN_SEGMENT_BYTES",
    "MULTI_SEGMENT_BYTES",
    "RING_SEGMENTS_PER_CHUNK",
    "SCRATCH_KEEP_BYTES",
    "SEGMENT_BYTES",
    "Plan",
]
