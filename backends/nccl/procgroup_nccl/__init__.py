"""procgroup over NVIDIA NCCL (CuPy arrays on CUDA GPUs).

Importing this package does not import CuPy. Besides the DataChannel (found through the
``procgroup`` entry point), it offers the seed's helpers: :func:`_register_stream`,
:func:`_clear_group_cache`, and the multi-GPU collectives of one process driving
several GPUs (:mod:`procgroup_nccl.multigpu`, also published as ``procgroup.<name>``).
"""

from __future__ import annotations

from typing import Any

import procgroup

from ._streams import register_stream as _register_stream
from .multigpu import (
    all_gather_multigpu,
    all_reduce_multigpu,
    broadcast_multigpu,
    reduce_multigpu,
)


def _clear_group_cache(group: Any = None) -> int:
    """Destroy the cached NCCL communicators of ``group`` (default: the world).

    Every member calls it, in the same order relative to its other ops; the next op
    makes a new communicator (a new unique id). Returns how many were dropped; groups
    of other backends have none (0).
    """
    if isinstance(group, procgroup.Group) and group.channel is None:
        return 0  # not a member, or destroyed: nothing cached here
    clear = getattr(procgroup.group_channel(group), "clear_cache", None)
    return 0 if clear is None else int(clear())


__all__ = [
    "_clear_group_cache",
    "_register_stream",
    "all_gather_multigpu",
    "all_reduce_multigpu",
    "broadcast_multigpu",
    "reduce_multigpu",
]
