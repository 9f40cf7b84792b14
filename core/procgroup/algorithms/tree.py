"""Binomial-tree broadcast and reduce: log2(n) rounds, latency-optimal for any size."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..ops import ReduceOp, finish_average, reduce_into

if TYPE_CHECKING:
    from ..backend import DataChannel


def broadcast(ch: DataChannel, array: np.ndarray, src: int, tag: int) -> None:
    """Copy ``src``'s array into every rank's array."""
    n = ch.size
    if n == 1:
        return
    vr = (ch.rank - src) % n
    mask = 1
    while mask < n:
        if vr & mask:
            ch.recv(array, (vr - mask + src) % n, tag)
            break
        mask <<= 1
    mask >>= 1
    works = []
    while mask > 0:
        if vr + mask < n:
            works.append(ch.isend(array, (vr + mask + src) % n, tag))
        mask >>= 1
    for work in works:
        work.wait()


def reduce(ch: DataChannel, array: np.ndarray, dst: int, op: ReduceOp, tag: int) -> None:
    """Reduce every rank's array into ``dst``'s; other ranks' arrays are left unchanged."""
    n = ch.size
    if n == 1 or array.size == 0:
        return
    vr = (ch.rank - dst) % n
    acc = array.reshape(-1)
    tmp: np.ndarray | None = None
    copied = ch.rank == dst
    mask = 1
    while mask < n:
        if vr & mask:
            ch.send(acc, (vr - mask + dst) % n, tag)
            return
        if vr + mask < n:
            if tmp is None:
                tmp = np.empty_like(acc)
            if not copied:  # accumulate in a copy: a non-root's array must not change
                acc, copied = acc.copy(), True
            ch.recv(tmp, (vr + mask + dst) % n, tag)
            reduce_into(op, acc, tmp)
        mask <<= 1
    finish_average(op, acc, n)
