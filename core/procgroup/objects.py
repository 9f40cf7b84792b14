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

import pickle
from typing import Any
from collections.abc import Sequence

import numpy as np

from . import _ops, _safe_pickle, _state
from ._safe_pickle import DEFAULT_MAX_OBJECT_BYTES, ENV_MAX_OBJECT_BYTES, max_object_bytes
from ._torch_args import member_or_none, root_rank, torch_names
from .errors import InvalidArgumentError, PeerError
from .groups import GroupArg

#: The largest pickle (bytes) one object collective moves per object and in all; set it
#: alike on every rank.
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


def _from_bytes(buf: np.ndarray, size: int, weights_only: bool = False, g: Any = None, sender: int = 0,
                op: str = "") -> Any:
    """Unpickle what group rank ``sender`` sent; ``weights_only``: plain data only."""
    try:
        return _safe_pickle.loads(buf[:size].tobytes(), weights_only)
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        who = g.global_rank(sender) if g is not None else sender
        raise PeerError(f"{op}: the object from rank {who} was refused: {exc}", rank=who) from None


def _host_member(group: Any, op: str) -> Any:
    """The group object collectives run on (see _state.host_group), or None on a non-member."""
    g = member_or_none(group, op)
    return None if g is None else _state.host_group(g)


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


@torch_names()
def all_gather_object(object_list: list[Any], obj: Any, group: GroupArg = None, weights_only: bool = False) -> None:
    """object_list[i] becomes member i's ``obj``, on every member (``weights_only``: build
    plain data only, see procgroup._safe_pickle)."""
    weights_only = _safe_pickle.check_flag(weights_only, "all_gather_object")
    g = _host_member(group, "all_gather_object")
    if g is None:
        return
    if not isinstance(object_list, list) or len(object_list) != g.size:
        raise InvalidArgumentError(
            f"all_gather_object: object_list must be a list of {g.size} entries (one per rank)"
        )
    sizes, padded = _pickle_padded(obj, g, "all_gather_object")
    outs = [np.empty(padded.size, dtype=np.uint8) for _ in range(g.size)]
    _ops.all_gather(outs, padded, group=g)
    for i in range(g.size):
        object_list[i] = _from_bytes(outs[i], sizes[i], weights_only, g, i, "all_gather_object")


@torch_names()
def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None, group: GroupArg = None,
                  group_dst: int | None = None, weights_only: bool = False) -> None:
    """World rank ``dst`` (default 0; or group rank ``group_dst``) gets every member's
    ``obj`` in object_gather_list."""
    weights_only = _safe_pickle.check_flag(weights_only, "gather_object")
    g = _host_member(group, "gather_object")
    if g is None:
        return
    root = root_rank(g, dst, group_dst, "dst", "gather_object", default=0)
    if g.rank == root and (not isinstance(object_gather_list, list) or len(object_gather_list) != g.size):
        raise InvalidArgumentError(
            f"gather_object: dst must pass object_gather_list, a list of {g.size} entries"
        )
    sizes, padded = _pickle_padded(obj, g, "gather_object")
    outs = [np.empty(padded.size, dtype=np.uint8) for _ in range(g.size)] if g.rank == root else None
    _ops.gather(padded, outs, group=g, group_dst=root)
    if outs is not None and object_gather_list is not None:
        for i in range(g.size):
            object_gather_list[i] = _from_bytes(outs[i], sizes[i], weights_only, g, i, "gather_object")


@torch_names()
def broadcast_object_list(object_list: list[Any], src: int | None = None, group: GroupArg = None, device: Any = None,
                          group_src: int | None = None, weights_only: bool = False) -> None:
    """Every member's object_list is replaced, element by element, with ``src``'s (default
    0; or group rank ``group_src``). ``device`` (torch's staging device) is accepted: the
    pickles always travel in host memory."""
    del device
    weights_only = _safe_pickle.check_flag(weights_only, "broadcast_object_list")
    g = _host_member(group, "broadcast_object_list")
    if g is None:
        return
    root = root_rank(g, src, group_src, "src", "broadcast_object_list", default=0)
    if not isinstance(object_list, list):
        raise InvalidArgumentError("broadcast_object_list: object_list must be a list")
    count = len(object_list)
    payloads = [_to_bytes(o) for o in object_list] if g.rank == root else []
    sizes = np.array([p.size for p in payloads] if payloads else [0] * count, dtype=np.int64)
    _ops.broadcast(sizes, group=g, group_src=root)
    _check_sizes(sizes.tolist(), root, g, "broadcast_object_list")
    total = int(sizes.sum())
    buf = np.concatenate(payloads) if payloads and total else np.empty(total, dtype=np.uint8)
    _ops.broadcast(buf, group=g, group_src=root)
    if g.rank != root:
        offset = 0
        for i, size in enumerate(sizes.tolist()):
            object_list[i] = _from_bytes(buf[offset : offset + size], size, weights_only, g, root,
                                         "broadcast_object_list")
            offset += size


@torch_names()
def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list: Sequence[Any] | None = None,
                        src: int | None = None, group: GroupArg = None, group_src: int | None = None,
                        weights_only: bool = False) -> None:
    """Member i gets ``src``'s (default 0; or group rank ``group_src``'s)
    scatter_object_input_list[i] in scatter_object_output_list[0]."""
    weights_only = _safe_pickle.check_flag(weights_only, "scatter_object_list")
    g = _host_member(group, "scatter_object_list")
    if g is None:
        return
    root = root_rank(g, src, group_src, "src", "scatter_object_list", default=0)
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise InvalidArgumentError("scatter_object_list: scatter_object_output_list must be a non-empty list")
    if g.rank == root:
        if not isinstance(scatter_object_input_list, (list, tuple)) or len(scatter_object_input_list) != g.size:
            raise InvalidArgumentError(
                f"scatter_object_list: src must pass scatter_object_input_list, a list of {g.size} objects"
            )
        payloads = [_to_bytes(o) for o in scatter_object_input_list]
        sizes = np.array([p.size for p in payloads], dtype=np.int64)
    else:
        sizes = np.zeros(g.size, dtype=np.int64)
    _ops.broadcast(sizes, group=g, group_src=root)
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
    _ops.scatter(out, ins, group=g, group_src=root)
    scatter_object_output_list[0] = _from_bytes(out, int(sizes[g.rank]), weights_only, g, root,
                                                "scatter_object_list")


@torch_names()
def send_object_list(object_list: Sequence[Any], dst: int | None = None, group: GroupArg = None, device: Any = None,
                     group_dst: int | None = None, use_batch: bool = False, weights_only: bool = False) -> None:
    """Send the picklable objects of ``object_list`` to world rank ``dst`` (or group rank
    ``group_dst``), whose recv_object_list gets them. ``device``, ``use_batch`` and
    ``weights_only`` (the receiver's choice) are accepted for torch's signature."""
    del device, use_batch
    _safe_pickle.check_flag(weights_only, "send_object_list")
    g = _host_member(group, "send_object_list")
    if g is None:
        return
    if not isinstance(object_list, (list, tuple)):
        raise InvalidArgumentError("send_object_list: object_list must be a list")
    peer = root_rank(g, dst, group_dst, "dst", "send_object_list")
    payloads = [_to_bytes(o) for o in object_list]
    sizes = np.array([p.size for p in payloads], dtype=np.int64)
    _check_sizes(sizes.tolist(), g.rank, g, "send_object_list")
    _ops.send(sizes, group=g, group_dst=peer)
    buf = np.concatenate(payloads) if payloads else np.empty(0, dtype=np.uint8)
    _ops.send(buf, group=g, group_dst=peer)


@torch_names()
def recv_object_list(object_list: list[Any], src: int | None = None, group: GroupArg = None, device: Any = None,
                     group_src: int | None = None, use_batch: bool = False, weights_only: bool = False) -> int:
    """Fill ``object_list`` with the objects world rank ``src`` (or group rank ``group_src``;
    any rank when neither is given) sent with send_object_list, which passed a list of the
    same length; returns the sender's world rank (-1 on a non-member, as torch)."""
    del device, use_batch
    weights_only = _safe_pickle.check_flag(weights_only, "recv_object_list")
    g = _host_member(group, "recv_object_list")
    if g is None:
        return -1
    if not isinstance(object_list, list):
        raise InvalidArgumentError("recv_object_list: object_list must be a list")
    peer = None if src is None and group_src is None else root_rank(g, src, group_src, "src", "recv_object_list")
    sizes = np.zeros(len(object_list), dtype=np.int64)
    sender = g.group_rank(_ops.recv(sizes, group=g, group_src=peer), "src")
    _check_sizes(sizes.tolist(), sender, g, "recv_object_list")
    buf = np.empty(int(sizes.sum()), dtype=np.uint8)
    _ops.recv(buf, group=g, group_src=sender)
    offset = 0
    for i, size in enumerate(sizes.tolist()):
        object_list[i] = _from_bytes(buf[offset : offset + size], size, weights_only, g, sender, "recv_object_list")
        offset += size
    return g.global_rank(sender)


__all__ = [
    "DEFAULT_MAX_OBJECT_BYTES",
    "ENV_MAX_OBJECT_BYTES",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "max_object_bytes",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]
