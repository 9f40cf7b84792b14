"""torch.distributed's group functions: new_group's signature, rank translations,
subgroups, and the launcher questions (is_torchelastic_launched, get_node_local_rank).

Groups are created collectively, as every procgroup group: every rank of the world calls
``new_group``/``new_subgroups*`` with the same arguments in the same order (torch's
default, ``use_local_synchronization=False``).
"""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping, Sequence

from . import _lifecycle, _state
from ._torch_args import torch_names
from .errors import InvalidArgumentError, UnsupportedOperationError
from .groups import Group


@torch_names()
def init_process_group(backend: str | None = None, init_method: str | None = None, timeout: Any = None,
                       world_size: int = -1, rank: int = -1, store: Any = None, group_name: str = "",
                       pg_options: Mapping[str, Any] | None = None, device_id: Any = None,
                       enable_reconfigure: bool = False, *, options: Mapping[str, Any] | None = None,
                       token: str | bytes | None = None) -> None:
    """Join the default process group: rendezvous, then connect the backend's channel.

    torch.distributed's parameters, in its order. ``backend`` defaults to
    $PROCGROUP_BACKEND, else "tcp"; ``init_method`` to "env://" (mpi under mpiexec takes
    its ranks from MPI); ``timeout`` (seconds or a timedelta, default $PROCGROUP_TIMEOUT or
    300 s) bounds every blocking call; ``store`` is an existing Store (with ``rank`` and
    ``world_size``). ``pg_options`` or procgroup's ``options``: the backend's settings (pass
    one). ``device_id`` is accepted and not needed; ``enable_reconfigure=True`` is refused.
    ``token`` is the job's secret, the same on every rank (default $PROCGROUP_JOB_TOKEN;
    docs/security.md).
    """
    del device_id
    if pg_options is not None and options is not None:
        raise TypeError("init_process_group() got both 'pg_options' and 'options' (procgroup's name for it); "
                        "pass only one")
    if enable_reconfigure:
        raise UnsupportedOperationError("init_process_group: enable_reconfigure=True is not supported; "
                                        "procgroup.shrink() rebuilds a group after a death")
    _lifecycle.init_process_group(backend, init_method, world_size=world_size, rank=rank, group_name=group_name,
                                  timeout=timeout, store=store, options=options if pg_options is None else pg_options,
                                  token=token)


@torch_names({"options": "pg_options"})
def new_group(ranks: Sequence[int] | None = None, timeout: Any = None, backend: str | None = None,
              pg_options: Mapping[str, Any] | None = None, use_local_synchronization: bool = False,
              group_desc: str | None = None, device_id: Any = None, sort_ranks: bool = True) -> Group:
    """Create a group of world ``ranks`` (default: all); every rank of the world calls it,
    in the same order. Members talk over the world's transport, or a channel of
    ``backend``/with ``pg_options`` (procgroup's backend settings, alias ``options``);
    non-members get a handle whose rank is -1. ``sort_ranks=False``: group rank i is
    ``ranks[i]``. ``group_desc`` and ``device_id`` are accepted and not needed."""
    del group_desc, device_id
    if use_local_synchronization:
        raise UnsupportedOperationError(
            "new_group: use_local_synchronization=True (only members call it) is not supported: procgroup "
            "creates groups collectively, so every rank of the world calls new_group with the same ranks")
    return _lifecycle.new_group(ranks, backend, timeout, pg_options, sort_ranks=sort_ranks)


@torch_names()
def get_process_group_ranks(group: Any) -> list[int]:
    """The world ranks of ``group``'s members, in group-rank order."""
    return list(_state.resolve(group).ranks)


@torch_names()
def get_global_rank(group: Any, group_rank: int) -> int:
    """The world rank of ``group``'s member ``group_rank``."""
    g = _state.resolve(group)
    if isinstance(group_rank, bool) or not isinstance(group_rank, int) or not 0 <= group_rank < g.size:
        raise InvalidArgumentError(f"get_global_rank: group_rank={group_rank!r} is not a rank of group "
                                   f"{list(g.ranks)} (0..{g.size - 1})")
    return g.global_rank(group_rank)


@torch_names()
def get_group_rank(group: Any, global_rank: int) -> int:
    """``global_rank``'s rank inside ``group`` (an error when it is not a member)."""
    return _state.resolve(group).group_rank(global_rank, "global_rank")


@torch_names()
def new_subgroups(group_size: int | None = None, group: Any = None, timeout: Any = None,
                  backend: str | None = None, pg_options: Mapping[str, Any] | None = None,
                  group_desc: str | None = None) -> tuple[Group, list[Group]]:
    """Split ``group`` (default: the world) into consecutive subgroups of ``group_size``
    ranks (default: $LOCAL_WORLD_SIZE, the ranks per machine); returns (this rank's
    subgroup, all of them)."""
    del group_desc
    parent = _state.resolve(group)
    if group_size is None:
        group_size = _local_world_size()
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidArgumentError(f"new_subgroups: group_size must be a positive int, got {group_size!r}")
    if parent.size % group_size:
        raise InvalidArgumentError(f"new_subgroups: group_size={group_size} does not divide the group's "
                                   f"{parent.size} ranks")
    ranks = list(parent.ranks)
    blocks = [ranks[i:i + group_size] for i in range(0, parent.size, group_size)]
    return _make_subgroups(blocks, timeout, backend, pg_options, "new_subgroups")


@torch_names()
def new_subgroups_by_enumeration(ranks_per_subgroup_list: list[list[int]], timeout: Any = None,
                                 backend: str | None = None, pg_options: Mapping[str, Any] | None = None,
                                 group_desc: str | None = None) -> tuple[Group | None, list[Group]]:
    """One subgroup per list of world ranks (the lists must not overlap); returns (this
    rank's subgroup or None, all of them)."""
    del group_desc
    if not isinstance(ranks_per_subgroup_list, (list, tuple)) or not ranks_per_subgroup_list:
        raise InvalidArgumentError("new_subgroups_by_enumeration: ranks_per_subgroup_list must be a non-empty "
                                   "list of lists of ranks")
    seen: set[int] = set()
    for ranks in ranks_per_subgroup_list:
        for r in ranks:
            if r in seen:
                raise InvalidArgumentError(f"new_subgroups_by_enumeration: rank {r} is in more than one subgroup")
            seen.add(r)
    return _make_subgroups([list(r) for r in ranks_per_subgroup_list], timeout, backend, pg_options,
                           "new_subgroups_by_enumeration")


def _make_subgroups(blocks: list[list[int]], timeout: Any, backend: str | None,
                    pg_options: Mapping[str, Any] | None, op: str) -> Any:
    me = _state.world().world.rank
    mine: Group | None = None
    groups = []
    for ranks in blocks:  # every rank creates every subgroup, in the same order
        g = _lifecycle.new_group(ranks, backend, timeout, pg_options)
        groups.append(g)
        if me in ranks:
            mine = g
    return mine, groups


def _local_world_size() -> int:
    raw = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not raw.isdigit():
        raise InvalidArgumentError("new_subgroups: group_size was not given and LOCAL_WORLD_SIZE (the ranks per "
                                   "machine, set by procgroup-run and torchrun) is not set; pass group_size")
    return int(raw)


@torch_names()
def is_backend_available(backend: str) -> bool:
    """True when backend ``backend`` is installed and can run here (its spec's own check:
    ``python -m procgroup info`` says why not)."""
    from .plugins import backends  # the plugin registry, loaded on first use

    spec = backends().get(str(backend).lower())
    return spec is not None and spec.unavailable() is None


def is_gloo_available() -> bool:
    return is_backend_available("gloo")


def is_mpi_available() -> bool:
    return is_backend_available("mpi")


def is_nccl_available() -> bool:
    return is_backend_available("nccl")


def is_torchelastic_launched() -> bool:
    """True when a torchrun-style launcher started this process (TORCHELASTIC_RUN_ID is
    set: torchrun and procgroup-run set it)."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its machine: $LOCAL_RANK, else ``fallback_rank``, else an error."""
    raw = os.environ.get("LOCAL_RANK")
    if raw is not None:
        try:
            return int(raw)
        except ValueError:
            raise InvalidArgumentError(f"environment variable LOCAL_RANK={raw!r} is not an int") from None
    if fallback_rank is not None:
        return int(fallback_rank)
    raise InvalidArgumentError("get_node_local_rank: LOCAL_RANK is not in the environment; pass fallback_rank "
                               "to run without a launcher that sets it")


__all__ = [
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_process_group_ranks",
    "init_process_group",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
]
