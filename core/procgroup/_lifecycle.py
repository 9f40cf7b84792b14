"""Joining and leaving: init_process_group, new_group, destroy_process_group, the local group.

The state they build lives in :mod:`._state`; the ops in :mod:`._ops` read it.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from typing import TYPE_CHECKING, Any
from collections.abc import Mapping, Sequence

from . import _auth, _logging, _ops, _state, config
from ._settings import Timeout, timeout_seconds
from .backend import DataChannel
from .errors import AlreadyInitializedError, CommTimeoutError, InvalidArgumentError, NotInitializedError
from .groups import Group, GroupArg
from .plugins import backends, load_channel_class

if TYPE_CHECKING:
    from .rendezvous import Store

log = logging.getLogger(__name__)


class Backend:
    """Names of the backends this project ships (any installed plugin name works too)."""

    TCP = "tcp"
    MPI = "mpi"
    GLOO = "gloo"
    NCCL = "nccl"


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    *,
    world_size: int = -1,
    rank: int = -1,
    group_name: str = "",
    timeout: Timeout = None,
    store: Store | None = None,
    options: Mapping[str, Any] | None = None,
    token: str | bytes | None = None,
) -> None:
    """Join the default process group: rendezvous, then connect the backend's channel.

    ``backend`` defaults to $PROCGROUP_BACKEND, else "tcp"; ``init_method`` to "env://"
    (a backend that finds its own peers, like mpi under mpiexec, needs none and takes rank
    and size from its launcher whatever the init method, which then serves only the job's
    Store: file:// and tcp://; env:// and none use the backend's own); ``timeout``
    (seconds or timedelta, default $PROCGROUP_TIMEOUT or 300 s) bounds every blocking call;
    ``options`` are the backend's own settings (see its docs), given to every channel.
    ``token`` is the job's secret, the same on every rank (default $PROCGROUP_JOB_TOKEN;
    procgroup-run sets one; file:// keeps one in its file): every connection of the job
    proves it holds it (docs/security.md).
    """
    with _state.lock:
        if _state.state is not None:
            raise AlreadyInitializedError(
                "init_process_group was already called; call destroy_process_group() first"
            )
        settings = config.init_settings(backend, init_method, world_size, rank, group_name, timeout,
                                        options=options, token=token, store=store)
        spec, cls = load_channel_class(settings.backend)
        # world_size=0 is torch's MPI recipe ("the launcher decides"): only for a backend
        # whose own launcher does decide
        settings.refuse_size_zero(unless=_launcher_decides(cls))
        cls.check_settings(options)  # before the rendezvous: every rank refuses alike, none waits
        _logging.configure(cls.__module__.split(".")[0], lambda: getattr(getattr(_state.state, "world", None), "rank", None))
        rank_, size, the_store, master_addr, key = _meet(settings, cls)
        st = _state.State(world=None, store=the_store, timeout=settings.timeout,  # type: ignore[arg-type]  # the world Group is set below, once its channel exists
                          master_addr=master_addr, options=dict(options or {}), job_key=key)
        ctx = _state.make_context(st, range(size), rank_, 0, "world", settings.timeout)
        try:
            channel = cls(ctx)
            _all_joined(ctx.store, rank_, size, settings.timeout)
        except BaseException:
            _close_quietly(the_store)  # a failed connect must not leave rank 0's server up
            raise
        st.world = Group(range(size), rank_, channel, spec, group_id=0)
        _state.state = st
        if "cpu" in _state.devices(st.world):
            _ops.bind_world(st.world)
        # a script that just ends still says goodbye, so its peers see "left", not "died"
        atexit.register(destroy_process_group)
        log.info("rank %d of %d joined the %s process group", rank_, size, spec.name)
    _after_init_hooks()


def _all_joined(store: Store, rank: int, size: int, timeout: float) -> None:
    """Return once every rank has built its channel, and (on rank 0) once every other rank
    knows it: a rank 0 that hosts the Store and returns at once, then exits (the 2017
    suite's ranks end with os._exit), must not pull the Store from under a rank that is
    still setting up. Two Store round trips per rank, once per job."""
    if size == 1:
        return
    store.add("init/built", 1)
    _wait_count(store, "init/built", size, timeout)
    if rank == 0:
        _wait_count(store, "init/seen", size - 1, timeout)
    else:
        store.add("init/seen", 1)


def _wait_count(store: Store, key: str, target: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    nap = 0.0005
    while store.add(key, 0) < target:
        if time.monotonic() > deadline:
            raise CommTimeoutError(f"init_process_group: not every rank finished joining within {timeout:g}s "
                                   f"({store.add(key, 0)} of {target})", op="init_process_group")
        time.sleep(nap)
        nap = min(nap * 2, 0.02)


def _store_key(store: Any, token: str | bytes | None, master_addr: str | None) -> bytes:
    """The job key: the one the store authenticated with (a TCPStore), else the token's."""
    inner, key = store, None
    for _ in range(16):  # through PrefixStores to the store that authenticated
        key = getattr(inner, "job_key", None)
        if key is not None or not hasattr(inner, "prefix"):
            break
        inner = getattr(inner, "store", None)
    if token is None and isinstance(key, bytes) and key:
        return key
    return _auth.resolve_token(token, master_addr, where="init_process_group")


def _meet(settings: config.InitSettings, cls: type[DataChannel]) -> tuple[int, int, Any, str | None, bytes]:
    """Find rank, size, a Store and the job key: from ``settings.store``, the backend
    itself, or the init method."""
    from .rendezvous import rendezvous

    store, token = settings.store, settings.token
    if store is not None:  # the settings checked rank and world_size against it
        return settings.rank, settings.world_size, store, None, _store_key(store, token, None)
    found = cls.discover_world()
    if found is not None:
        # the backend's own launcher (mpiexec) says who is who, whatever the init method
        # (the 2017 module's rule for MPI); the init method may still serve the Store
        rank_, size = found
        _check_discovered(cls, settings, rank_, size)
        method = settings.init_method
        if method is None or method.split("://", 1)[0].lower() == "env":
            found_store = cls.discover_store(rank_, size, settings.timeout)
            return rank_, size, found_store, None, _store_key(found_store, token, None)
        result = rendezvous(method, rank=rank_, world_size=size, group_name=settings.group_name,
                            timeout=settings.timeout, token=token)
        key = result.job_key or _auth.resolve_token(token, result.master_addr, where="init_process_group")
        return rank_, size, result.store, result.master_addr, key
    result = rendezvous(
        settings.init_method or "env://", rank=settings.rank, world_size=settings.world_size,
        group_name=settings.group_name, timeout=settings.timeout, token=token,
    )
    key = result.job_key or _auth.resolve_token(token, result.master_addr, where="init_process_group")
    return result.rank, result.world_size, result.store, result.master_addr, key


def _launcher_decides(cls: type[DataChannel]) -> bool:
    """True for a backend whose own launcher may decide rank and size (overrides discover_world)."""
    return getattr(cls.discover_world, "__func__", None) is not DataChannel.discover_world.__func__  # type: ignore[attr-defined]  # a classmethod's function


def _check_discovered(cls: type[DataChannel], settings: config.InitSettings, rank: int, size: int) -> None:
    """A rank or size in the URL or RANK/WORLD_SIZE that contradicts the backend's launcher
    is an error: a wrong world is never formed silently. Arguments that differ are ignored
    with a warning, as torch.distributed does for MPI (its recipes pass rank=0,
    world_size=0 or 1 under mpiexec); -1 means "not given" and is silent. Except when the
    launcher says a world of 1 and the arguments ask for more: processes started without
    the launcher, each its own world, which is refused."""
    import urllib.parse
    import warnings

    name = cls.backend_name or "this"
    given: dict[str, tuple[int, str]] = {}
    ignored: list[str] = []
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(settings.init_method or "").query))
    for field, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        value = getattr(settings, field)
        if value != -1:
            if size == 1 and value > (0 if field == "rank" else 1):
                # more than MPI's singleton: ranks started without the launcher, each alone
                given[field] = (value, f"argument {field}={value}")
            elif value != (rank if field == "rank" else size):
                ignored.append(f"{field}={value}")
        elif query.get(field, "").strip().isdigit():
            given[field] = (int(query[field]), f"URL parameter {field}={query[field]}")
        elif os.environ.get(var, "").strip().isdigit():
            given[field] = (int(os.environ[var]), f"environment variable {var}={os.environ[var].strip()}")
    if ignored:
        warnings.warn(
            f"init_process_group: the {name} backend takes rank and world size from its launcher, "
            f"which says rank={rank} and world_size={size}; the argument {' and '.join(ignored)} "
            f"{'is' if len(ignored) == 1 else 'are'} ignored", UserWarning, stacklevel=4)
    want_rank = given.get("rank", (rank, ""))[0]
    want_size = given.get("world_size", (size, ""))[0]
    if want_rank == rank and want_size == size:
        return
    sources = " and ".join(src for _, src in given.values())
    hint = cls.launch_hint
    hint = hint.format(size=want_size) if hint else f"start the ranks with the {name} backend's own launcher"
    raise InvalidArgumentError(
        f"init_process_group: {sources} contradicts the {name} launcher, which says "
        f"world_size={size} and rank={rank}: the {name} backend was given rank {want_rank} of a world "
        f"of {want_size}, but this process is rank {rank} of {size}, and the {name} backend takes "
        f"ranks from its launcher whatever the init method; {hint}"
    )


def _check_rank(rank: int, size: int, where: str) -> None:
    if not 0 <= rank < size:
        raise InvalidArgumentError(f"{where}: rank {rank} is outside the world of size {size}")


def _after_init_hooks() -> None:
    """Once the world exists: tracebacks to procgroup-run's error file, its local group."""
    from ._launch.rankside import install_error_handler

    install_error_handler()
    maybe_create_local_group_from_env()


def destroy_process_group(group: GroupArg = None) -> None:
    """Close ``group``'s channel, or every channel and the Store when no group is given."""
    with _state.lock:
        st = _state.state
        if st is None:
            return
        target = _state.resolve(group)  # None, group.WORLD and 0 are the world
        if target is not st.world:
            _close_group(target)
            return
        for hook in list(_state.teardown_hooks):
            try:
                hook()
            except Exception:  # logged; the channels must close anyway
                log.warning("a teardown hook failed", exc_info=True)
        _ops.bind_world(None)
        for g in reversed(st.groups):
            _close_group(g)
        _close_group(st.world)
        _close_quietly(st.store)
        for thing in st.retired:  # what shrink() replaced (channels, stores, store servers)
            _close_quietly(thing)
        _state.state = None
        atexit.unregister(destroy_process_group)


def _close_quietly(store: Any) -> None:
    close = getattr(store, "close", None) or getattr(store, "stop", None)
    if close is not None:
        try:
            close()
        except Exception:  # logged; teardown must finish
            log.debug("store close failed", exc_info=True)


def _close_group(g: Group) -> None:
    for grp in (g.host_group, g):
        if grp is not None and grp.channel is not None:
            grp.fast = None
            try:
                grp.channel.close()
            except Exception:  # logged; keep tearing down the rest
                log.warning("closing %r failed", grp, exc_info=True)
            grp.channel = None


def is_initialized() -> bool:
    return _state.state is not None


def is_available() -> bool:
    """True when procgroup has at least one installed backend."""
    return bool(backends())


def get_rank(group: GroupArg = None) -> int:
    """This process's rank in ``group`` (-1 when not a member)."""
    return _state.resolve(group).rank


def get_world_size(group: GroupArg = None) -> int:
    """The number of ranks in ``group`` (default: the world)."""
    return _state.resolve(group).size


def get_num_processes(group: GroupArg = None) -> int:
    """The design note's (and the 2017 module's) name for :func:`get_world_size`."""
    return get_world_size(group)


def get_backend(group: GroupArg = None) -> str:
    return _state.resolve(group).backend


# --------------------------------------------------------------------- groups
def new_group(ranks: Sequence[int] | None = None, backend: str | None = None, timeout: Timeout = None,
              options: Mapping[str, Any] | None = None, *, sort_ranks: bool = True) -> Group:
    """Create a group of world ``ranks``; every rank of the world calls it, in the same order.

    Members talk over the world's transport (or a new channel of ``backend``, or of the world's
    backend when ``options`` are given: they apply to a channel of its own); non-members
    get a handle whose ``rank`` is -1. ``sort_ranks=False`` keeps the order given (group
    rank i is ``ranks[i]``), as torch's.
    """
    st = _state.world()
    size = st.world.size
    if ranks is None:
        ranks = list(range(size))
    try:
        members = [int(r) for r in ranks]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"new_group: ranks must be a list of ints, got {ranks!r}") from None
    if sort_ranks:
        members.sort()
    if len(set(members)) != len(members):
        raise InvalidArgumentError(f"new_group: ranks {list(ranks)} contain duplicates")
    for r in members:
        _check_rank(r, size, "new_group")
    if not members:
        raise InvalidArgumentError("new_group: ranks must not be empty")
    secs = st.timeout if timeout is None else timeout_seconds(timeout)
    with _state.lock:
        gid = st.next_group_id
        st.next_group_id += 1
    my_rank = members.index(st.world.rank) if st.world.rank in members else -1
    spec = st.world.spec
    channel: DataChannel | None = None
    if my_rank >= 0:
        ctx = _state.make_context(st, members, my_rank, gid, "group", secs, dict(options or {}))
        world_channel = st.world.channel
        if world_channel is None:
            raise NotInitializedError("the world group was destroyed")
        if (backend is None or backend.lower() == st.world.backend) and not options:
            channel = world_channel.new_group(list(members), ctx)
        else:  # another backend, or options the world's channel was not built with: a channel of its own
            spec, cls = load_channel_class(backend or st.world.backend)
            channel = cls(ctx)
    g = Group(members, my_rank, channel, spec, gid)
    if channel is not None and "cpu" in _state.devices(g):
        _ops.bind_group(g)
    st.groups.append(g)
    return g


def group_channel(group: GroupArg = None, op: str = "group_channel") -> DataChannel:
    """The DataChannel of ``group`` (default: the world), for a backend's own calls
    (nccl's ``*_multigpu``, say); raises, naming ``op``, when this process is not a member."""
    return _state.group_channel(group, op)


# --------------------------------------------------------------------- the local group
def create_local_process_group(num_workers_per_machine: int) -> None:
    """Create the group of this machine's ranks. Collective: every rank calls it, same value.

    Ranks ``k*n .. k*n+n-1`` form machine k's group. Calling it again with the same value is
    a no-op (init may already have done it); another value raises InvalidArgumentError.
    """
    if isinstance(num_workers_per_machine, bool) or not isinstance(num_workers_per_machine, int):
        raise InvalidArgumentError(
            f"num_workers_per_machine must be an int, got {type(num_workers_per_machine).__name__}"
        )
    if _state.state is None:
        raise NotInitializedError("create_local_process_group needs init_process_group first")
    st = _state.state
    world_size = st.world.size
    n = num_workers_per_machine
    if n < 1 or world_size % n != 0:
        raise InvalidArgumentError(
            f"num_workers_per_machine={n} must be >= 1 and divide the world size {world_size}"
        )
    if st.local_group is not None:
        if st.local_size == n:
            return
        raise InvalidArgumentError(
            f"a local process group of {st.local_size} workers per machine already exists; "
            f"cannot create one of {n}"
        )
    machine = st.world.rank // n
    mine: Group | None = None
    for i in range(world_size // n):  # every rank creates every group, in the same order
        group = new_group(list(range(i * n, (i + 1) * n)))
        if i == machine:
            mine = group
    st.local_group, st.local_size = mine, n
    log.debug("local process group: ranks %d..%d", machine * n, machine * n + n - 1)


def maybe_create_local_group_from_env() -> None:
    """Create the local group from LOCAL_WORLD_SIZE when procgroup is initialized.

    Called by ``init_process_group`` on every rank at the same point. The decision uses only
    values equal on every rank of a consistent launch (LOCAL_WORLD_SIZE, the world size), so
    either all ranks create the groups or none does.
    """
    value = os.environ.get("LOCAL_WORLD_SIZE")
    st = _state.state
    if not value or st is None:
        return
    try:
        n = int(value)
    except ValueError:
        log.warning("LOCAL_WORLD_SIZE=%r is not an integer; no local process group", value)
        return
    world_size, rank = st.world.size, st.world.rank
    if n < 1 or world_size % n != 0:
        log.warning("LOCAL_WORLD_SIZE=%d does not divide the world size %d; no local process group",
                    n, world_size)
        return
    if st.local_group is not None and st.local_size == n:
        return
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and local_rank != str(rank % n):
        log.warning(
            "LOCAL_RANK=%s but rank %d is local rank %d of its block of %d: the local group "
            "may not match this machine", local_rank, rank, rank % n, n,
        )
    create_local_process_group(n)


__all__ = [
    "Backend",
    "create_local_process_group",
    "destroy_process_group",
    "get_backend",
    "get_num_processes",
    "get_rank",
    "get_world_size",
    "group_channel",
    "init_process_group",
    "is_available",
    "is_initialized",
    "maybe_create_local_group_from_env",
    "new_group",
]
