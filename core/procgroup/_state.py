"""The process-group state: the world, its groups, the local group and the side channels.

One module-level :class:`State` while procgroup is initialized. Everything above it (the
public ops, the object collectives, ``utils.comm``) reads it through the functions here.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from . import arrays
from .backend import BackendSpec, ChannelContext, DataChannel
from .errors import BackendNotFoundError, GroupRevokedError, InvalidArgumentError, NotInitializedError, PeerError
from .groups import Group, GroupArg, GroupMember
from .plugins import load_channel_class, side_channel_spec

log = logging.getLogger(__name__)


@dataclass
class State:
    world: Group
    store: Any
    timeout: float
    master_addr: str | None
    options: dict[str, Any] = field(default_factory=dict)
    groups: list[Group] = field(default_factory=list)
    next_group_id: int = 1
    #: the group of this machine's ranks (utils.comm.create_local_process_group)
    local_group: Group | None = None
    local_size: int | None = None
    #: the job's key (procgroup._auth.job_key): every connection a channel opens proves it
    job_key: bytes | None = None
    #: channels, stores and store servers that shrink() replaced; closed at destroy
    retired: list[Any] = field(default_factory=list)


state: State | None = None
lock = threading.RLock()
#: called (in order) by destroy_process_group() of the whole world before any channel
#: closes: master-worker mode ends its workers here
teardown_hooks: list[Callable[[], None]] = []


def world() -> State:
    if state is None:
        raise NotInitializedError("procgroup is not initialized: call procgroup.init_process_group() first")
    return state


def resolve(group: GroupArg) -> Group:
    """The Group for ``group`` (None or group.WORLD: the world)."""
    st = world()
    if group is None or group is GroupMember.WORLD:
        return st.world
    if isinstance(group, Group):
        return group
    if type(group) is int:  # the 2017 module's int groups: 0 is the world, n the n-th new_group
        found = st.world if group == 0 else next((g for g in st.groups if g.group_id == group), None)
        if found is not None:
            return found
    raise InvalidArgumentError(f"group must be a procgroup Group, group.WORLD or a group id "
                               f"(0 is the world), got {group!r}")


def member(group: GroupArg, op: str) -> Group:
    """The Group for ``group``, which this process belongs to and which is still open."""
    g = resolve(group)
    if not g.is_member:
        raise InvalidArgumentError(f"{op}: rank {world().world.rank} is not a member of group {list(g.ranks)}")
    if g.channel is None:
        if g.retired:
            raise GroupRevokedError(f"{op}: {g.retired}")
        raise NotInitializedError(f"{op}: the group was destroyed")
    return g


def group_channel(group: GroupArg = None, op: str = "group_channel") -> DataChannel:
    """The DataChannel of ``group`` (default: the world), for backend-specific calls."""
    channel = member(group, op).channel
    assert channel is not None  # member() checked
    return channel


def devices(g: Group) -> tuple[str, ...]:
    """What the group's channel takes directly: its own answer (CUDA-aware MPI), else the spec's."""
    return getattr(g.channel, "devices", None) or g.spec.devices


def make_context(st: State, members: Sequence[int], my_rank: int, gid: int, label: str, timeout: float,
                 options: dict[str, Any] | None = None) -> ChannelContext:
    from .rendezvous import PrefixStore

    return ChannelContext(
        rank=my_rank, size=len(members), store=PrefixStore(f"pg/{label}{gid}", st.store), timeout=timeout,
        master_addr=st.master_addr, global_ranks=tuple(members), group_id=gid,
        options={**st.options, **(options or {})}, open_side_channel=open_side_channel,
        job_key=st.job_key,
    )


def open_side_channel(ctx: ChannelContext) -> DataChannel:
    """A host point-to-point channel over ctx's members: the best installed side-channel
    backend (tcp where installed), picked through the registry, never by import."""
    spec = side_channel_spec()
    if spec is None:
        raise BackendNotFoundError(
            "this backend needs a host side channel, and no installed backend can serve as one; "
            "install procgroup-tcp (pip install procgroup-tcp)"
        )
    _, cls = load_channel_class(spec.name)
    return cls(ctx)


def host_group(g: Group) -> Group:
    """The group object collectives run on: ``g`` itself when its backend moves host
    arrays over authenticated connections (``BackendSpec.authenticated``: tcp), else a
    cached side group of it on the host side channel (tcp).

    Object collectives unpickle what arrives, so it must come from members of the job:
    gloo's and MPI's own transports do not know the job token, and nccl moves device
    memory only. Created lazily by the first object collective, which every member
    calls, so the creation is collective too.
    """
    if arrays.CPU in devices(g) and g.spec.authenticated:
        return g
    if g.host_group is None:
        spec: BackendSpec | None = side_channel_spec()
        if spec is None and arrays.CPU in devices(g):
            _warn_unauthenticated_objects(g)
            return g
        dead = g.channel.failed_ranks() if g.channel is not None else ()
        if dead:  # its set-up would wait for the dead member until the timeout
            gone = [g.ranks[r] for r in dead]
            raise PeerError(f"object collectives on this group run on a host side channel made on first use, "
                            f"and rank(s) {gone} of the group failed: use a group without them",
                            rank=gone[0], ranks=gone)
        st = world()
        ctx = make_context(st, g.ranks, g.rank, g.group_id, "host", st.timeout)
        g.host_group = Group(g.ranks, g.rank, open_side_channel(ctx), spec or g.spec, g.group_id)
    return g.host_group


_warned_backends: set[str] = set()


def _warn_unauthenticated_objects(g: Group) -> None:
    """No side channel is installed: the objects travel over the backend's own transport."""
    if g.backend not in _warned_backends:
        _warned_backends.add(g.backend)
        log.warning("object collectives on backend %r run over its own transport, which does not check the "
                    "job token (no side-channel backend is installed: pip install procgroup-tcp)", g.backend)


__all__ = [
    "State",
    "devices",
    "group_channel",
    "host_group",
    "lock",
    "make_context",
    "member",
    "open_side_channel",
    "resolve",
    "state",
    "teardown_hooks",
    "world",
]
