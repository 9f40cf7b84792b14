"""Communication helpers for training scripts (detectron2's ``comm`` module, on procgroup).

Every function works before ``init_process_group`` (a world of one: rank 0, size 1, the
collectives return their input) and with any backend. Object collectives (``all_gather``,
``gather``, ``shared_random_seed``) and ``reduce_dict`` (NumPy values) run on a CPU side
group (``new_group(backend="tcp")``, created once and cached) when the world backend is
nccl, because nccl moves device memory only.

Local groups: ``create_local_process_group(n)`` splits the world into blocks of ``n``
consecutive ranks (one block per machine, the numbering procgroup-run uses).
``init_process_group`` calls :func:`maybe_create_local_group_from_env` at its end, so
under procgroup-run the local group exists without any call in the script.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

import procgroup as pg
from procgroup.errors import (
    InvalidArgumentError,
    InvalidArrayError,
    NotInitializedError,
)

logger = logging.getLogger(__name__)

__all__ = [
    "all_gather",
    "create_local_process_group",
    "gather",
    "get_local_process_group",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "is_main_process",
    "maybe_create_local_group_from_env",
    "reduce_dict",
    "shared_random_seed",
    "synchronize",
]

_LOCAL_PROCESS_GROUP: Any = None
_LOCAL_SIZE: int | None = None

_MISSING_LOCAL_PG_ERROR = (
    "no local process group: call procgroup.utils.comm.create_local_process_group("
    "num_workers_per_machine) on every rank (procgroup-run jobs get one from "
    "init_process_group automatically)"
)


def _reset_cache() -> None:
    """Forget the cached local group; ``destroy_process_group`` calls this."""
    global _LOCAL_PROCESS_GROUP, _LOCAL_SIZE
    _LOCAL_PROCESS_GROUP = None
    _LOCAL_SIZE = None


def _drop_if_stale() -> None:
    """Forget cached groups whose channel is closed (a destroy, maybe a new init, since).

    A backstop for re-initialization in one process; ``destroy_process_group`` resetting
    the cache through :func:`_reset_cache` is the primary path.
    """
    if _LOCAL_PROCESS_GROUP is not None and getattr(_LOCAL_PROCESS_GROUP, "channel", True) is None:
        _reset_cache()


def _initialized() -> bool:
    return bool(pg.is_initialized())


def get_world_size() -> int:
    """Ranks in the world; 1 before ``init_process_group``."""
    return int(pg.get_world_size()) if _initialized() else 1


def get_rank() -> int:
    """This process's rank in the world; 0 before ``init_process_group``."""
    return int(pg.get_rank()) if _initialized() else 0


def is_main_process() -> bool:
    """True on rank 0 (and in a process that never initialized procgroup)."""
    return get_rank() == 0


def create_local_process_group(num_workers_per_machine: int) -> None:
    """Create the group of this machine's ranks. Collective: every rank calls it, same value.

    Ranks ``k*n .. k*n+n-1`` form machine k's group. Calling it again with the same value is
    a no-op (init may already have done it); another value raises InvalidArgumentError.
    """
    global _LOCAL_PROCESS_GROUP, _LOCAL_SIZE
    if isinstance(num_workers_per_machine, bool) or not isinstance(num_workers_per_machine, int):
        raise InvalidArgumentError(
            f"num_workers_per_machine must be an int, got {type(num_workers_per_machine).__name__}"
        )
    if not _initialized():
        raise NotInitializedError("create_local_process_group needs init_process_group first")
    _drop_if_stale()
    world_size = get_world_size()
    n = num_workers_per_machine
    if n < 1 or world_size % n != 0:
        raise InvalidArgumentError(
            f"num_workers_per_machine={n} must be >= 1 and divide the world size {world_size}"
        )
    if _LOCAL_PROCESS_GROUP is not None:
        if _LOCAL_SIZE == n:
            return
        raise InvalidArgumentError(
            f"a local process group of {_LOCAL_SIZE} workers per machine already exists; "
            f"cannot create one of {n}"
        )
    machine = get_rank() // n
    mine: Any = None
    for i in range(world_size // n):  # every rank creates every group, in the same order
        group = pg.new_group(list(range(i * n, (i + 1) * n)))
        if i == machine:
            mine = group
    _LOCAL_PROCESS_GROUP, _LOCAL_SIZE = mine, n
    logger.debug("local process group: ranks %d..%d", machine * n, machine * n + n - 1)


def maybe_create_local_group_from_env() -> None:
    """Create the local group from LOCAL_WORLD_SIZE when procgroup is initialized.

    Called by ``init_process_group`` on every rank at the same point. The decision uses only
    values equal on every rank of a consistent launch (LOCAL_WORLD_SIZE, the world size), so
    either all ranks create the groups or none does.
    """
    _drop_if_stale()
    value = os.environ.get("LOCAL_WORLD_SIZE")
    if not value or not _initialized():
        return
    try:
        n = int(value)
    except ValueError:
        logger.warning("LOCAL_WORLD_SIZE=%r is not an integer; no local process group", value)
        return
    world_size = get_world_size()
    if n < 1 or world_size % n != 0:
        logger.warning(
            "LOCAL_WORLD_SIZE=%d does not divide the world size %d; no local process group",
            n, world_size,
        )
        return
    if _LOCAL_PROCESS_GROUP is not None and _LOCAL_SIZE == n:
        return
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and local_rank != str(get_rank() % n):
        logger.warning(
            "LOCAL_RANK=%s but rank %d is local rank %d of its block of %d: the local group "
            "may not match this machine",
            local_rank, get_rank(), get_rank() % n, n,
        )
    create_local_process_group(n)


def get_local_process_group() -> Any:
    """The group of this machine's ranks (see :func:`create_local_process_group`)."""
    _drop_if_stale()
    if _LOCAL_PROCESS_GROUP is None:
        raise NotInitializedError(_MISSING_LOCAL_PG_ERROR)
    return _LOCAL_PROCESS_GROUP


def get_local_rank() -> int:
    """This process's rank within its machine; 0 before init."""
    if not _initialized():
        return 0
    return int(pg.get_rank(group=get_local_process_group()))


def get_local_size() -> int:
    """Ranks on this machine; 1 before init."""
    if not _initialized():
        return 1
    return int(pg.get_world_size(group=get_local_process_group()))


def synchronize() -> None:
    """Barrier over the world; a no-op before init or in a world of one."""
    if not _initialized() or get_world_size() == 1:
        return
    pg.barrier()


def _cpu_group() -> Any:
    """The world's group for host data: the world itself or, on a CUDA-only backend
    (nccl), the tcp side group procgroup's own object collectives use (made on first use,
    collectively: every rank reaches it from the same call)."""
    from procgroup._api import _resolve, host_group

    return host_group(_resolve(None))


def all_gather(data: Any, group: Any = None) -> list[Any]:
    """Gather a picklable object from every rank of ``group`` (default: the world) on all."""
    if get_world_size() == 1:
        return [data]
    if group is None:
        group = _cpu_group()
    world_size = int(pg.get_world_size(group=group))
    if world_size == 1:
        return [data]
    output: list[Any] = [None] * world_size
    pg.all_gather_object(output, data, group=group)
    return output


def gather(data: Any, dst: int = 0, group: Any = None) -> list[Any]:
    """Gather a picklable object on global rank ``dst``: the list there, ``[]`` elsewhere."""
    if get_world_size() == 1:
        return [data]
    if group is None:
        group = _cpu_group()
    world_size = int(pg.get_world_size(group=group))
    if world_size == 1:
        return [data]
    if get_rank() == dst:
        output: list[Any] = [None] * world_size
        pg.gather_object(data, output, dst=dst, group=group)
        return output
    pg.gather_object(data, None, dst=dst, group=group)
    return []


def shared_random_seed() -> int:
    """A random int in [0, 2**31) that is the same on every rank (rank 0's draw)."""
    ints = int(np.random.randint(2**31))
    return int(all_gather(ints)[0])


def reduce_dict(input_dict: Mapping[str, Any], average: bool = True) -> dict[str, Any]:
    """Sum (or average) same-keyed scalar values to rank 0, as detectron2 does.

    Values: NumPy scalars / 0-d arrays / Python numbers (any same shape works), reduced as
    float64, so ranks may pass different real number types (an int sum comes back as a
    float64); complex values are reduced as complex128 and must be complex on every rank. Rank 0
    gets the reduced values as 0-d NumPy arrays (averaged when ``average``); the other ranks get
    whatever their reduce buffer holds afterwards (detectron2's behaviour; do not use it).
    Keys are processed in sorted order, so every rank must pass the same keys.
    """
    world_size = get_world_size()
    if world_size < 2:
        return dict(input_dict)
    names = sorted(input_dict.keys())
    if not names:
        return {}
    try:
        values = np.stack([np.asarray(input_dict[k]) for k in names])
    except ValueError as exc:
        raise InvalidArrayError(f"reduce_dict: values must all have the same shape: {exc}") from exc
    if values.dtype == object or not (
        np.issubdtype(values.dtype, np.number) or values.dtype == np.bool_
    ):
        raise InvalidArrayError(f"reduce_dict: values must be numbers, got dtype {values.dtype}")
    # one dtype on every rank whatever each passed (a float32 loss here, a Python float
    # there): the reduce must see the same bytes per value everywhere
    values = np.ascontiguousarray(values, dtype=np.complex128 if values.dtype.kind == "c" else np.float64)
    group = _cpu_group()
    pg.reduce(values, dst=0, op=pg.ReduceOp.SUM, group=group)
    if get_rank() == 0 and average:
        values /= world_size
    return {k: values[i, ...] for i, k in enumerate(names)}
