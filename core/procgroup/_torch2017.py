"""The 2017 torch.distributed module's halves of gather and scatter.

In 2017 the root called ``gather_recv``/``scatter_send`` and every other member
``gather_send``/``scatter_recv``; each is the root's or a member's part of one
:func:`procgroup.gather` / :func:`procgroup.scatter`, so they mix freely with those.
"""

from __future__ import annotations

from typing import Any

from . import _ops, _state
from .backend import Work


def gather_send(tensor: Any, dst: int, group: Any = None) -> Work | None:
    """A member's part of a gather to world rank ``dst``."""
    return _ops.gather(tensor, None, dst, group)


def gather_recv(gather_list: list[Any], tensor: Any, group: Any = None) -> Work | None:
    """The root's part of a gather: gather_list[i] receives member i's tensor (this
    process's own ``tensor`` included)."""
    return _ops.gather(tensor, gather_list, _state.world().world.rank, group)


def scatter_send(scatter_list: list[Any], tensor: Any, group: Any = None) -> Work | None:
    """The root's part of a scatter: member i receives scatter_list[i]; this process's
    own piece lands in ``tensor``."""
    return _ops.scatter(tensor, scatter_list, _state.world().world.rank, group)


def scatter_recv(tensor: Any, src: int, group: Any = None) -> Work | None:
    """A member's part of a scatter from world rank ``src``, into ``tensor``."""
    return _ops.scatter(tensor, None, src, group)


__all__ = ["gather_recv", "gather_send", "scatter_recv", "scatter_send"]
