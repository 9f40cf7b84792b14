"""Object collectives: picklable Python objects moved as uint8 arrays.

Sizes travel first (one int64 per rank), then the pickles, padded to the largest, so
every backend's array collectives carry them unchanged. What is unpickled came over
connections that passed the job-token handshake: the group's own channel where its
backend says so (tcp), else a tcp side group of the same members
(``_state.host_group``; docs/security.md). A size a peer announces is checked before anything is
allocated: negative or over :data:`ENV_MAX_OBJECT_BYTES` (default 4 GiB) is an error on
every rank (they all see the same sizes), never a huge allocation.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Sequence

import numpy as np

from . import _ops, _state
from .errors import InvalidArgumentError, PeerError

#: The largest pickle (bytes) one object collective moves per object and in all; set it
#: alike on every rank.
ENV_MAX_OBJECT_BYTES = "PROCGROUP_MAX_OBJECT_BYTES"
DEFAULT_MAX_OBJECT_BYTES = 2**32


def max_object_bytes() -> int:
    """$PROCGROUP_MAX_OBJECT_BYTES, else 4 GiB."""
    raw = os.environ.get(ENV_MAX_OBJECT_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_OBJECT_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise InvalidArgumentError(f"environment variable {ENV_MAX_OBJECT_BYTES}={raw!r}: expected a positive "
                                   f"number of bytes")
    return value


def _check_sizes(sizes: Sequence[int], owner: int, g: Any, op: str) -> None:
    """Refuse pickle sizes announced by group rank ``owner`` that are negative or over the
    limit (each, and in all). Every rank checks the same sizes, so every rank raises alike
    and nobody is left waiting for the payload."""
    limit = max_object_bytes()
    total = 0
    for size in sizes:
        total += max(size, 0)
        if 0 <= size <= limit and total <= limit:
            continue
        what = f"a pickle of {size} bytes" if size < 0 or size > limit else f"pickles of {total} bytes in all"
        why = ("a negative size (a corrupt or forged announcement)" if size < 0 else
               f"over the limit of {limit} bytes ({ENV_MAX_OBJECT_BYTES}; set it alike on every rank)")
        if owner == g.rank:
            raise InvalidArgumentError(f"{op}: this rank's objects are {what}, {why}")
        who = g.global_rank(owner)
        raise PeerError(f"{op}: rank {who} announced {what}, {why}", rank=who)


def _to_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def _from_bytes(buf: np.ndarray, size: int) -> Any:
    return pickle.loads(buf[:size].tobytes())  # noqa: S301 - peers of one job trust each other


def _pickle_padded(obj: Any, g: Any, op: str) -> tuple[list[int], np.ndarray]:
    """Every member's pickle size, and this member's pickle padded to the largest."""
    data = _to_bytes(obj)
    announced = [np.zeros(1, dtype=np.int64) for _ in range(g.size)]
    _ops.all_gather(announced, np.array([data.size], dtype=np.int64), group=g)
    sizes = [int(s[0]) for s in announced]
    for rank, size in enumerate(sizes):
        _check_sizes([size], rank, g, op)
    padded = np.zeros(max(sizes), dtype=np.uint8)
    padded[: data.size] = data
    return sizes, padded


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """object_list[i] becomes member i's ``obj``, on every member."""
    g = _state.host_group(_state.member(group, "all_gather_object"))
    if not isinstance(object_list, list) or len(object_list) != g.size:
        raise InvalidArgumentError(
            f"all_gather_object: object_list must be a list of {g.size} entries (one per rank)"
        )
    sizes, padded = _pickle_padded(obj, g, "all_gather_object")
    outs = [np.empty(padded.size, dtype=np.uint8) for _ in range(g.size)]
    _ops.all_gather(outs, padded, group=g)
    for i in range(g.size):
        object_list[i] = _from_bytes(outs[i], sizes[i])


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0, group: Any = None) -> None:
    """World rank ``dst`` gets every member's ``obj`` in object_gather_list."""
    g = _state.host_group(_state.member(group, "gather_object"))
    root = g.group_rank(dst, "dst")
    if g.rank == root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size):
        raise InvalidArgumentError(
            f"gather_object: dst must pass object_gather_list, a list of {g.size} entries"
        )
    sizes, padded = _pickle_padded(obj, g, "gather_object")
    outs = [np.empty(padded.size, dtype=np.uint8) for _ in range(g.size)] if g.rank == root else None
    _ops.gather(padded, outs, dst=dst, group=g)
    if outs is not None and object_gather_list is not None:
        for i in range(g.size):
            object_gather_list[i] = _from_bytes(outs[i], sizes[i])


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """Every member's object_list is replaced, element by element, with ``src``'s."""
    g = _state.host_group(_state.member(group, "broadcast_object_list"))
    root = g.group_rank(src, "src")
    if not isinstance(object_list, list):
        raise InvalidArgumentError("broadcast_object_list: object_list must be a list")
    count = len(object_list)
    payloads = [_to_bytes(o) for o in object_list] if g.rank == root else []
    sizes = np.array([p.size for p in payloads] if payloads else [0] * count, dtype=np.int64)
    _ops.broadcast(sizes, src, group=g)
    _check_sizes(sizes.tolist(), root, g, "broadcast_object_list")
    total = int(sizes.sum())
    buf = np.concatenate(payloads) if payloads and total else np.empty(total, dtype=np.uint8)
    _ops.broadcast(buf, src, group=g)
    if g.rank != root:
        offset = 0
        for i, size in enumerate(sizes.tolist()):
            object_list[i] = _from_bytes(buf[offset : offset + size], size)
            offset += size


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: list[Any] | None,
                        src: int = 0, group: Any = None) -> None:
    """Member i gets ``src``'s scatter_object_input_list[i] in scatter_object_output_list[0]."""
    g = _state.host_group(_state.member(group, "scatter_object_list"))
    root = g.group_rank(src, "src")
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise InvalidArgumentError("scatter_object_list: scatter_object_output_list must be a non-empty list")
    if g.rank == root:
        if not isinstance(scatter_object_input_list, list) or len(scatter_object_input_list) != g.size:
            raise InvalidArgumentError(
                f"scatter_object_list: src must pass scatter_object_input_list, a list of {g.size} objects"
            )
        payloads = [_to_bytes(o) for o in scatter_object_input_list]
        sizes = np.array([p.size for p in payloads], dtype=np.int64)
    else:
        sizes = np.zeros(g.size, dtype=np.int64)
    _ops.broadcast(sizes, src, group=g)
    for size in sizes.tolist():  # each alone: every rank receives one, padded to the longest
        _check_sizes([size], root, g, "scatter_object_list")
    longest = int(sizes.max())
    ins = None
    if g.rank == root:
        ins = []
        for p in payloads:
            padded = np.zeros(longest, dtype=np.uint8)
            padded[: p.size] = p
            ins.append(padded)
    out = np.empty(longest, dtype=np.uint8)
    _ops.scatter(out, ins, src=src, group=g)
    scatter_object_output_list[0] = _from_bytes(out, int(sizes[g.rank]))


__all__ = [
    "DEFAULT_MAX_OBJECT_BYTES",
    "ENV_MAX_OBJECT_BYTES",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "max_object_bytes",
    "scatter_object_list",
]
