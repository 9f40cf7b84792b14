"""Ring algorithms: bandwidth-optimal all_reduce, all_gather and reduce_scatter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

import numpy as np

from ..ops import ReduceOp, finish_average, reduce_into

if TYPE_CHECKING:
    from ..backend import DataChannel

#: Below this many bytes all_reduce uses recursive doubling (log2 n steps, not 2(n-1)).
SMALL_ALL_REDUCE_BYTES = 64 * 1024


def exchange(ch: DataChannel, out: Any, dst: int, into: Any, src: int, tag: int) -> None:
    """Send ``out`` to ``dst`` while receiving ``into`` from ``src`` (recv posted first,
    so a transport can land the payload straight in ``into``)."""
    work = ch.irecv(into, src, tag)
    ch.send(out, dst, tag)
    work.wait()


def chunk_bounds(count: int, parts: int) -> list[int]:
    """Split ``count`` elements into ``parts`` near-equal runs; returns parts+1 offsets."""
    return [(i * count) // parts for i in range(parts + 1)]


def all_reduce(ch: DataChannel, array: np.ndarray, op: ReduceOp, tag: int) -> None:
    """In-place all_reduce: recursive doubling when small, ring (RS + AG) when large."""
    n = ch.size
    if n == 1 or array.size == 0:
        return
    if array.nbytes <= SMALL_ALL_REDUCE_BYTES:
        recursive_doubling_all_reduce(ch, array, op, tag)
    else:
        ring_all_reduce(ch, array, op, tag)


def recursive_doubling_all_reduce(ch: DataChannel, array: np.ndarray, op: ReduceOp, tag: int) -> None:
    """log2(n) exchange rounds; ranks beyond the largest power of two fold in first."""
    n, r = ch.size, ch.rank
    flat = array.reshape(-1)
    tmp = np.empty_like(flat)
    p2 = 1 << (n.bit_length() - 1)
    extra = n - p2
    if r >= p2:  # fold into a partner, then wait for the result
        ch.send(flat, r - p2, tag)
        ch.recv(flat, r - p2, tag)
        return
    if r < extra:
        ch.recv(tmp, r + p2, tag)
        reduce_into(op, flat, tmp)
    mask = 1
    while mask < p2:
        peer = r ^ mask
        exchange(ch, flat, peer, tmp, peer, tag)
        # every op is commutative, so both partners compute bit-identical results
        reduce_into(op, flat, tmp)
        mask <<= 1
    finish_average(op, flat, n)
    if r < extra:
        ch.send(flat, r + p2, tag)


def ring_all_reduce(ch: DataChannel, array: np.ndarray, op: ReduceOp, tag: int) -> None:
    """Reduce-scatter then all-gather around the ring: each rank sends 2(n-1)/n of the data."""
    n, r = ch.size, ch.rank
    flat = array.reshape(-1)
    bounds = chunk_bounds(flat.size, n)
    chunks = [flat[bounds[i] : bounds[i + 1]] for i in range(n)]
    tmp = np.empty(max(c.size for c in chunks), dtype=flat.dtype)
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_idx, recv_idx = (r - step) % n, (r - step - 1) % n
        incoming = tmp[: chunks[recv_idx].size]
        exchange(ch, chunks[send_idx], right, incoming, left, tag)
        reduce_into(op, chunks[recv_idx], incoming)
    finish_average(op, chunks[(r + 1) % n], n)
    for step in range(n - 1):
        send_idx, recv_idx = (r + 1 - step) % n, (r - step) % n
        exchange(ch, chunks[send_idx], right, chunks[recv_idx], left, tag)


def all_gather(ch: DataChannel, output_list: Sequence[Any], array: np.ndarray, tag: int) -> None:
    """output_list[i] = rank i's array; n-1 ring steps, received straight into place."""
    n, r = ch.size, ch.rank
    outs = [o.reshape(-1) for o in output_list]
    if outs[r].ctypes.data != array.ctypes.data:
        outs[r][...] = array.reshape(-1)
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        exchange(ch, outs[(r - step) % n], right, outs[(r - step - 1) % n], left, tag)


def reduce_scatter(ch: DataChannel, output: np.ndarray, input_list: Sequence[np.ndarray],
                   op: ReduceOp, tag: int) -> None:
    """output = op over ranks of input_list[rank]; inputs are left untouched."""
    n, r = ch.size, ch.rank
    out = output.reshape(-1)
    ins = [a.reshape(-1) for a in input_list]
    if n == 1:
        out[...] = ins[0]
        return
    right, left = (r + 1) % n, (r - 1) % n
    buffers = [np.empty_like(out), np.empty_like(out)]
    outgoing: np.ndarray = ins[(r - 1) % n]
    for step in range(n - 1):
        recv_idx = (r - step - 2) % n
        incoming = out if step == n - 2 else buffers[step % 2]
        exchange(ch, outgoing, right, incoming, left, tag)
        reduce_into(op, incoming, ins[recv_idx])
        outgoing = incoming
    finish_average(op, out, n)
