"""Communication helpers for training scripts (detectron2's ``comm`` module, on procgroup).

Every function works before ``init_process_group`` (a world of one: rank 0, size 1, the
collectives return their input) and with any backend. Object collectives (``all_gather``,
``gather``, ``shared_random_seed``) and ``reduce_dict`` (NumPy values) run on a CPU side
group (the host side channel, created once and cached) when the world backend is nccl,
because nccl moves device memory only.

Local groups: ``create_local_process_group(n)`` splits the world into blocks of ``n``
consecutive ranks (one block per machine, the numbering procgroup-run uses).
``init_process_group`` calls :func:`maybe_create_local_group_from_env` at its end, so
under procgroup-run the local group exists without any call in the script. The group is
kept in procgroup's process-group state, so a destroy forgets it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import procgroup as pg
from procgroup import _state
from procgroup._lifecycle import create_local_process_group, maybe_create_local_group_from_env
from procgroup.errors import InvalidArrayError, NotInitializedError


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

_MISSING_LOCAL_PG_ERROR = (
    "no local process group: call procgroup.utils.comm.create_local_process_group("
    "num_workers_per_machine) on every rank (procgroup-run jobs get one from "
    "init_process_group automatically)"
)


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


def get_local_process_group() -> Any:
    """The group of this machine's ranks (see :func:`create_local_process_group`)."""
    st = _state.state
    if st is None or st.local_group is None:
        raise NotInitializedError(_MISSING_LOCAL_PG_ERROR)
    return st.local_group


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
    """The world's group for pickled data: the world itself on tcp or, on a backend whose
    transport does not check the job token or moves device memory only (gloo, mpi,
    nccl), the tcp side group procgroup's own object collectives use (made on first use,
    collectively: every rank reaches it from the same call)."""
    return _state.host_group(_state.resolve(None))


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
