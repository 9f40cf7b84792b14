"""Direct algorithms: gather, scatter, pairwise all_to_all and a dissemination barrier."""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidArgumentError
from .ring import exchange

if TYPE_CHECKING:
    from ..backend import DataChannel


def _copy_if_distinct(dst: np.ndarray, src: np.ndarray) -> None:
    if dst.size and dst.ctypes.data != src.ctypes.data:
        dst.reshape(-1)[...] = src.reshape(-1)


def gather(ch: DataChannel, array: np.ndarray, gather_list: Sequence[np.ndarray] | None,
           dst: int, tag: int) -> None:
    """The root receives every rank's array into gather_list[rank], all at once."""
    if ch.rank != dst:
        ch.send(array, dst, tag)
        return
    if gather_list is None:
        raise InvalidArgumentError(f"gather: rank {dst} is the root and needs a gather_list")
    works = [ch.irecv(gather_list[i], i, tag) for i in range(ch.size) if i != dst]
    _copy_if_distinct(gather_list[dst], array)
    for work in works:
        work.wait()


def scatter(ch: DataChannel, array: np.ndarray, scatter_list: Sequence[np.ndarray] | None,
            src: int, tag: int) -> None:
    """The root sends scatter_list[rank] to each rank."""
    if ch.rank != src:
        ch.recv(array, src, tag)
        return
    if scatter_list is None:
        raise InvalidArgumentError(f"scatter: rank {src} is the root and needs a scatter_list")
    works = [ch.isend(scatter_list[i], i, tag) for i in range(ch.size) if i != src]
    _copy_if_distinct(array, scatter_list[src])
    for work in works:
        work.wait()


def all_to_all(ch: DataChannel, output_list: Sequence[np.ndarray],
               input_list: Sequence[np.ndarray], tag: int) -> None:
    """Pairwise exchange: in step s send to rank+s, receive from rank-s (n-1 steps)."""
    n, r = ch.size, ch.rank
    _copy_if_distinct(output_list[r], input_list[r])
    for step in range(1, n):
        dst, src = (r + step) % n, (r - step) % n
        exchange(ch, input_list[dst], dst, output_list[src], src, tag)


def barrier(ch: DataChannel, tag: int) -> None:
    """Dissemination barrier: ceil(log2 n) rounds of one-byte messages."""
    n, r = ch.size, ch.rank
    token = np.zeros(1, dtype=np.uint8)
    incoming = np.empty(1, dtype=np.uint8)
    dist = 1
    while dist < n:
        exchange(ch, token, (r + dist) % n, incoming, (r - dist) % n, tag)
        dist <<= 1
