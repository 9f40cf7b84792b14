"""torch's batched point-to-point: ``P2POp`` and ``batch_isend_irecv``.

The list is checked before any op starts (every entry a P2POp, each with an isend/irecv
op and one peer); then each op is started as an isend or irecv, in list order, which
checks its tensor, tag and peer as those calls do. They all progress at once, so the
order inside a batch cannot deadlock (ring exchanges post their sends and receives
together).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from . import _ops
from ._torch_args import torch_names
from .backend import Work
from .errors import InvalidArgumentError


class P2POp:
    """One point-to-point op of a batch: ``op`` is procgroup.isend or procgroup.irecv (or
    send/recv, taken as their non-blocking forms), ``peer`` a world rank or ``group_peer``
    a rank in ``group``."""

    @torch_names()
    def __init__(self, op: Callable[..., Any], tensor: Any, peer: int | None = None, group: Any = None,
                 tag: int = 0, group_peer: int | None = None) -> None:
        if op not in _KINDS:
            raise InvalidArgumentError("P2POp: op must be procgroup.isend or procgroup.irecv "
                                       f"(or send/recv), got {op!r}")
        if (peer is None) == (group_peer is None):
            raise InvalidArgumentError("P2POp: pass exactly one of peer (a world rank) and group_peer")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        who = f"peer={self.peer}" if self.group_peer is None else f"group_peer={self.group_peer}"
        return f"P2POp({_KINDS[self.op]}, {who}, tag={self.tag})"


_KINDS: dict[Callable[..., Any], str] = {_ops.isend: "isend", _ops.irecv: "irecv", _ops.send: "isend",
                                         _ops.recv: "irecv"}


@torch_names()
def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every op of the list; returns their Works, in the list's order (a rank outside
    an op's group gets no Work for it, as torch's non-members)."""
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise InvalidArgumentError("batch_isend_irecv: p2p_op_list must be a non-empty list of P2POp")
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise InvalidArgumentError(f"batch_isend_irecv: p2p_op_list[{i}] is a {type(p).__name__}, not a P2POp")
    works: list[Work] = []
    for p in p2p_op_list:
        if _KINDS[p.op] == "isend":
            work = _ops.isend(p.tensor, p.peer, p.group, p.tag, group_dst=p.group_peer)
        else:
            work = _ops.irecv(p.tensor, p.peer, p.group, p.tag, group_src=p.group_peer)
        if work is not None:
            works.append(work)
    return works


__all__ = ["P2POp", "batch_isend_irecv"]
