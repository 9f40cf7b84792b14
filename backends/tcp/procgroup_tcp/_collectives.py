"""Which algorithm runs a collective over the sockets, by size and world size.

Small arrays are latency-bound: the fewest rounds win (recursive doubling for
all_reduce, the binomial tree for broadcast and reduce, from ``procgroup.algorithms``).
Large arrays are bandwidth-bound: the segmented, pipelined ring and chains of
``procgroup.algorithms.pipelined`` move each byte the fewest times and overlap the network with the
reduction. The crossover sizes below were measured with ``bench/socket_thresholds.py``
(docs/performance.md has the tables that chose them); ``PROCGROUP_TCP_RING_MIN_BYTES``,
``PROCGROUP_TCP_CHAIN_MIN_BYTES`` and ``PROCGROUP_TCP_SEGMENT_BYTES`` override them.
Ranks on one host never get here for these ops: the channel runs them in shared memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from procgroup.algorithms import pipelined, ring, tree
from procgroup.backend import DataChannel, env_bytes
from procgroup.ops import ReduceOp


#: all_reduce of at least this many bytes takes the pipelined ring, smaller ones recursive
#: doubling; by world size (the largest key not above the size applies). Measured: 2 ranks
#: on one host, doubling won to 512 KiB, the ring from 1 MiB; 4 hosts of the simulated
#: cluster (1 Gbit/s, 0.1 ms), the ring 1.6x ahead at 256 KiB and 2x at 1 MiB.
RING_MIN_BYTES = {2: 1 << 20, 3: 1 << 20, 4: 256 * 1024}
#: broadcast of at least this many bytes takes the segmented chain, smaller ones the
#: binomial tree. Measured: 2 ranks, level to 256 KiB, the chain ahead from 1 MiB; 4 hosts
#: of the simulated cluster, level at 1 MiB, the chain 1.9x ahead at 4 MiB and 2.6x at
#: 16 MiB (on one 2-core host with PROCGROUP_TCP_SHM=0 the tree won: each hop costs CPU the
#: ranks share, but ranks on one host use the shared-memory arena, not this path).
BROADCAST_CHAIN_MIN_BYTES = {2: 1 << 20, 3: 2 << 20}
#: reduce: the chain from this size. Measured: 2 ranks, the tree to 1 MiB, the chain at
#: 4 MiB; 4 ranks, level at 64 KiB, the chain 1.2x ahead at 256 KiB and 2x at 1 MiB.
REDUCE_CHAIN_MIN_BYTES = {2: 2 << 20, 3: 256 * 1024}
#: The segment of the pipelines on two ranks: big enough to amortise a frame, small
#: enough to overlap (512 KiB to 2 MiB measured level within the noise).
SEGMENT_BYTES = 1 << 20
#: On three or more ranks a pipeline keeps several segments in flight per stage (a ring
#: step's chunk in RING_SEGMENTS_PER_CHUNK, a chain's array in CHAIN_SEGMENTS_PER_HOP per
#: hop), each from MIN_SEGMENT_BYTES to MULTI_SEGMENT_BYTES. Measured on 8 simulated hosts
#: (1 Gbit/s, 0.1 ms; torch gloo 117-118 MB/s in the same runs): all_reduce 4 MiB, whose
#: 512 KiB chunks went as one segment each, 102 MB/s bus bandwidth, in two 112 MB/s, in
#: four the same; 64 MiB in 1 MiB segments 110-113 MB/s, 512 KiB 114-115, 256 and 128 KiB
#: 117-118; the 4 MiB chain broadcast 91 ms in 1 MiB segments, 53 ms in 256 KiB (gloo 209 ms).
#: On 4 hosts 256 KiB and 1 MiB were level.
MULTI_SEGMENT_BYTES = 256 * 1024
MIN_SEGMENT_BYTES = 128 * 1024
RING_SEGMENTS_PER_CHUNK = 2
CHAIN_SEGMENTS_PER_HOP = 2
#: Scratch kept between calls per channel (larger needs are allocated per call).
SCRATCH_KEEP_BYTES = 256 << 20


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
        and no gaps between steps to hide, and on one host a finer cut only cost CPU (1 MiB
        all_reduce 0.52-0.99 ms against 0.50-0.56 ms). A segment set by hand
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


__all__ = [
    "BROADCAST_CHAIN_MIN_BYTES",
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
