"""The public functions: process-group state, validation, then a direct channel call.

Every call validates its arguments locally (before anything is sent), translates world
ranks to group ranks, stages CUDA arrays through host memory for CPU-only backends, and
then calls the group's DataChannel method directly.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from . import arrays, config
from .channel import MAX_USER_TAG, ChannelContext, DataChannel, Work
from .errors import (
    AlreadyInitializedError,
    InvalidArgumentError,
    InvalidArrayError,
    NotInitializedError,
    ProcGroupError,
    UnsupportedOperationError,
)
from .groups import Group, GroupMember, group
from .ops import ReduceOp, check_op_dtype
from .plugins import backends, load_channel_class

log = logging.getLogger(__name__)


class Backend:
    """Names of the backends this project ships (any installed plugin name works too)."""

    TCP = "tcp"
    MPI = "mpi"
    GLOO = "gloo"
    NCCL = "nccl"


@dataclass
class _State:
    world: Group
    store: Any
    timeout: float
    master_addr: str | None
    groups: list[Group] = field(default_factory=list)
    next_group_id: int = 1


_state: _State | None = None
_state_lock = threading.RLock()


# --------------------------------------------------------------------- init / teardown
def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    *,
    world_size: int = -1,
    rank: int = -1,
    group_name: str = "",
    timeout: Any = None,
    store: Any = None,
) -> None:
    """Join the default process group: rendezvous, then connect the backend's channel.

    ``backend`` defaults to $PROCGROUP_BACKEND, else "tcp"; ``init_method`` to "env://"
    (a backend that finds its own peers, like mpi under mpiexec, needs none); ``timeout``
    (seconds or timedelta, default $PROCGROUP_TIMEOUT or 300 s) bounds every blocking call.
    """
    global _state
    with _state_lock:
        if _state is not None:
            raise AlreadyInitializedError(
                "init_process_group was already called; call destroy_process_group() first"
            )
        settings = config.init_settings(backend, init_method, world_size, rank, group_name, timeout)
        spec, cls = load_channel_class(settings.backend)
        rank_, size, the_store, master_addr = _meet(settings, cls, store)
        from .rendezvous import PrefixStore

        ctx = ChannelContext(
            rank=rank_, size=size, store=PrefixStore("pg/world", the_store), timeout=settings.timeout,
            master_addr=master_addr, global_ranks=tuple(range(size)), group_id=0,
        )
        try:
            channel = cls(ctx)
        except BaseException:
            _close_quietly(the_store)  # a failed connect must not leave rank 0's server up
            raise
        world = Group(range(size), rank_, channel, spec, group_id=0)
        _state = _State(world=world, store=the_store, timeout=settings.timeout, master_addr=master_addr)
        if arrays.CPU in _devices(world):
            _set_world_all_reduce(channel.all_reduce if channel.native_order
                                  else functools.partial(channel.run, "all_reduce"))
        # a script that just ends still says goodbye, so its peers see "left", not "died"
        atexit.register(destroy_process_group)
        log.info("rank %d of %d joined the %s process group", rank_, size, spec.name)
    _after_init_hooks()


def _meet(settings: config.InitSettings, cls: type[DataChannel], store: Any) -> tuple[int, int, Any, str | None]:
    """Find rank, size and a Store: from ``store``, the backend itself, or the init method."""
    from .rendezvous import rendezvous

    if store is not None:
        if settings.init_method is not None:
            raise InvalidArgumentError("init_process_group: pass either init_method or store, not both")
        if settings.rank < 0 or settings.world_size < 1:
            raise InvalidArgumentError("init_process_group: with store=..., rank and world_size must be given")
        _check_rank(settings.rank, settings.world_size, "init_process_group")
        return settings.rank, settings.world_size, store, None
    found = cls.discover_world() if settings.init_method is None else None
    if found is not None:
        rank_, size = found
        for name, given, actual in (("world_size", settings.world_size, size), ("rank", settings.rank, rank_)):
            if given != -1 and given != actual:
                raise InvalidArgumentError(
                    f"init_process_group: argument {name}={given} contradicts the {cls.backend_name} "
                    f"launcher, which says {name}={actual}"
                )
        return rank_, size, cls.discover_store(rank_, size, settings.timeout), None
    result = rendezvous(
        settings.init_method or "env://", rank=settings.rank, world_size=settings.world_size,
        group_name=settings.group_name, timeout=settings.timeout,
    )
    return result.rank, result.world_size, result.store, result.master_addr


def _check_rank(rank: int, size: int, where: str) -> None:
    if not 0 <= rank < size:
        raise InvalidArgumentError(f"{where}: rank {rank} is outside the world of size {size}")


def _after_init_hooks() -> None:
    """Once the world exists: tracebacks to procgroup-run's error file, its local group."""
    from ._launch.rankside import install_error_handler
    from .utils import comm

    install_error_handler()
    comm.maybe_create_local_group_from_env()


def destroy_process_group(group: Any = None) -> None:
    """Close ``group``'s channel, or every channel and the Store when no group is given."""
    global _state
    with _state_lock:
        if _state is None:
            return
        if group is not None and group is not GroupMember.WORLD and group is not _state.world:
            _close_group(group)
            return
        _set_world_all_reduce(None)
        for g in reversed(_state.groups):
            _close_group(g)
        _close_group(_state.world)
        from .utils import comm

        comm._reset_cache()
        _close_quietly(_state.store)
        _state = None
        atexit.unregister(destroy_process_group)


def _close_quietly(store: Any) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - teardown must finish
            log.debug("store close failed", exc_info=True)


def _close_group(g: Group) -> None:
    for grp in (g.host_group, g):
        if grp is not None and grp.channel is not None:
            try:
                grp.channel.close()
            except Exception:  # noqa: BLE001 - keep tearing down the rest
                log.warning("closing %r failed", grp, exc_info=True)
            grp.channel = None


def is_initialized() -> bool:
    return _state is not None


def is_available() -> bool:
    """True when procgroup has at least one installed backend."""
    return bool(backends())


def _world() -> _State:
    if _state is None:
        raise NotInitializedError("procgroup is not initialized: call procgroup.init_process_group() first")
    return _state


def _resolve(group_: Any) -> Group:
    st = _world()
    if group_ is None or group_ is GroupMember.WORLD:
        return st.world
    if isinstance(group_, Group):
        return group_
    raise InvalidArgumentError(f"group must be a procgroup Group or group.WORLD, got {group_!r}")


def _member(group_: Any, op: str) -> Group:
    g = _resolve(group_)
    if not g.is_member:
        raise InvalidArgumentError(
            f"{op}: rank {_world().world.rank} is not a member of group {list(g.ranks)}"
        )
    if g.channel is None:
        raise NotInitializedError(f"{op}: the group was destroyed")
    return g


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (-1 when not a member)."""
    return _resolve(group).rank


def get_world_size(group: Any = None) -> int:
    return _resolve(group).size


def get_backend(group: Any = None) -> str:
    return _resolve(group).backend


# --------------------------------------------------------------------- array handling
@dataclass
class _Prepared:
    native: Any  # what the channel gets
    original: Any  # what the user passed
    staged: bool  # native is a host copy of a CUDA array
    dtype: np.dtype
    count: int  # elements


def _host(array: np.ndarray, original: Any, staged: bool) -> _Prepared:
    return _Prepared(array, original, staged, array.dtype, array.size)


def _devices(g: Group) -> tuple[str, ...]:
    """What the group's channel takes directly: its own answer (e.g. CUDA-aware MPI), else the spec's."""
    return getattr(g.channel, "devices", None) or g.spec.devices


def _prepare(g: Group, array: Any, name: str, op: str, *, writable: bool, reads: bool = True) -> _Prepared:
    """What the channel gets for ``array``; ``reads=False``: the op only writes it, so a
    staged CUDA array needs no copy to the host first."""
    if type(array) is np.ndarray and arrays.CPU in g.spec.devices and array.flags.c_contiguous \
            and (array.flags.writeable or not writable) and array.dtype.kind in "biufc" \
            and array.dtype.isnative:
        return _Prepared(array, array, False, array.dtype, array.size)  # the common case, fast
    device = arrays.device_of(array)
    devices = _devices(g)
    if device == arrays.CUDA:
        if arrays.CUDA in devices:
            info = arrays.cuda_info(array, name=name)  # rejects non-contiguous arrays early
            if writable and info.read_only:
                raise InvalidArrayError(f"{name} is read-only, but {op} writes its result into it")
            return _Prepared(array, array, False, info.dtype, info.nbytes // max(info.dtype.itemsize, 1))
        return _host(arrays.stage_to_host(array, name=name, writable=writable, copy=reads), array, staged=True)
    if arrays.CPU not in devices:
        raise UnsupportedOperationError(
            f"{op}: backend {g.backend!r} moves CUDA arrays only, but {name} is in host memory; "
            f"move it to the GPU (cupy.asarray(...)) or use a CPU group: new_group(backend='tcp')"
        )
    return _host(arrays.as_host_array(array, name=name, writable=writable), array, staged=False)


def _prepare_list(g: Group, items: Any, name: str, op: str, like: _Prepared | None, *, writable: bool,
                  reads: bool = True) -> list[_Prepared]:
    """One array per rank, each like ``like`` (or like the first, when None)."""
    if not isinstance(items, (list, tuple)):
        raise InvalidArgumentError(f"{op}: {name} must be a list of arrays, got {type(items).__name__}")
    if len(items) != g.size:
        raise InvalidArgumentError(f"{op}: {name} has {len(items)} arrays but the group has {g.size} ranks")
    out = [_prepare(g, a, f"{name}[{i}]", op, writable=writable, reads=reads) for i, a in enumerate(items)]
    for i, p in enumerate(out):
        _same_layout(p, like or out[0], f"{name}[{i}]", op)
    return out


def _same_layout(p: _Prepared, like: _Prepared, name: str, op: str) -> None:
    if p.dtype != like.dtype or p.count != like.count:
        raise InvalidArrayError(
            f"{op}: {name} has dtype {p.dtype} and {p.count} elements, but the array has "
            f"dtype {like.dtype} and {like.count} elements; they must match"
        )


def _copy_back(prepared: Sequence[_Prepared]) -> Callable[[Any], None]:
    def finish(_: Any = None) -> None:
        for p in prepared:
            if p.staged:
                arrays.copy_back(p.native, p.original)
    return finish


class _ThenWork(Work):
    """Wraps a backend's Work so staged CUDA results are copied back on wait()."""

    def __init__(self, inner: Work, then: Callable[[Any], None], result_map: Callable[[Any], Any] | None = None) -> None:
        self.op = inner.op
        self._inner = inner
        self._then = then
        self._done = False
        self._map = result_map

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def wait(self, timeout: float | None = None) -> bool:
        self._inner.wait(timeout)
        if not self._done:
            self._done = True
            self._then(self._inner.result())
        return True

    def exception(self) -> BaseException | None:
        return self._inner.exception()

    def result(self) -> Any:
        value = self._inner.result()
        return self._map(value) if self._map is not None and value is not None else value


def _execute(g: Group, op: str, args: tuple[Any, ...], written: Sequence[_Prepared], async_op: bool) -> Work | None:
    """Run collective ``op`` on ``g``'s channel, now or as a Work; copy staged results back."""
    channel: Any = g.channel  # _member() checked it is there
    staged = [p for p in written if p.staged]
    try:
        if async_op:
            work = channel.submit(op, *args)
            return _ThenWork(work, _copy_back(staged)) if staged else work
        channel.run(op, *args)
    except ProcGroupError as exc:
        _name_op(exc, op, g)
        raise
    if staged:
        _copy_back(staged)()
    return None


def _name_op(exc: BaseException, op: str, g: Group) -> None:
    """Prefix a transport error with the op and group, keeping its type and attributes."""
    if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith(op):
        where = "" if g.group_id == 0 else f" (group {list(g.ranks)})"
        exc.args = (f"{op}{where}: {exc.args[0]}",) + exc.args[1:]


# --------------------------------------------------------------------- point to point
def _check_tag(tag: int, op: str) -> None:
    if isinstance(tag, bool) or not isinstance(tag, int) or not 0 <= tag < MAX_USER_TAG:
        raise InvalidArgumentError(f"{op}: tag must be an int in [0, 2**31), got {tag!r}")


def _peer(g: Group, rank: int, what: str, op: str) -> int:
    peer = g.group_rank(rank, what)
    if peer == g.rank:
        raise InvalidArgumentError(f"{op}: {what}={rank} is this process's own rank")
    return peer


def send(array: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    """Send ``array`` to world rank ``dst``; blocks until the buffer may be reused."""
    g = _member(group, "send")
    _check_tag(tag, "send")
    peer = _peer(g, dst, "dst", "send")
    p = _prepare(g, array, "array", "send", writable=False)
    try:
        g.channel.send(p.native, peer, tag)  # type: ignore[union-attr]
    except ProcGroupError as exc:
        _name_op(exc, "send", g)
        raise


def recv(array: Any, src: int | None = None, group: Any = None, tag: int = 0) -> int:
    """Receive into ``array`` from ``src`` (any rank when None); returns the sender's rank."""
    g = _member(group, "recv")
    _check_tag(tag, "recv")
    peer = None if src is None else _peer(g, src, "src", "recv")
    p = _prepare(g, array, "array", "recv", writable=True, reads=False)
    try:
        sender = g.channel.recv(p.native, peer, tag)  # type: ignore[union-attr]
    except ProcGroupError as exc:
        _name_op(exc, "recv", g)
        raise
    _copy_back([p])()
    return g.global_rank(sender)


def isend(array: Any, dst: int, group: Any = None, tag: int = 0) -> Work:
    """Start sending ``array``; don't touch it until the returned Work is waited on."""
    g = _member(group, "isend")
    _check_tag(tag, "isend")
    peer = _peer(g, dst, "dst", "isend")
    p = _prepare(g, array, "array", "isend", writable=False)
    return g.channel.isend(p.native, peer, tag)  # type: ignore[union-attr]


def irecv(array: Any, src: int | None = None, group: Any = None, tag: int = 0) -> Work:
    """Start receiving into ``array``; ``Work.source_rank()`` is the sender after wait()."""
    g = _member(group, "irecv")
    _check_tag(tag, "irecv")
    peer = None if src is None else _peer(g, src, "src", "irecv")
    p = _prepare(g, array, "array", "irecv", writable=True, reads=False)
    work = g.channel.irecv(p.native, peer, tag)  # type: ignore[union-attr]
    return _ThenWork(work, _copy_back([p]), result_map=g.global_rank)


# --------------------------------------------------------------------- collectives
def broadcast(array: Any, src: int, group: Any = None, async_op: bool = False) -> Work | None:
    """Copy world rank ``src``'s array into every member's array."""
    g = _member(group, "broadcast")
    root = g.group_rank(src, "src")
    p = _prepare(g, array, "array", "broadcast", writable=True, reads=g.rank == root)
    return _execute(g, "broadcast", (p.native, root), [p], async_op)


#: (op, dtype) pairs that passed check_op_dtype for a native NumPy array, and the world
#: channel's blocking all_reduce when it takes host arrays: all_reduce's fast path, the
#: call whose fixed cost decides small-message latency.
_reduce_checked: dict[ReduceOp, set[np.dtype]] = {op: set() for op in ReduceOp}
_world_all_reduce: Callable[[Any, ReduceOp], None] | None = None
_ndarray = np.ndarray


def _set_world_all_reduce(run: Callable[[Any, ReduceOp], None] | None) -> None:
    global _world_all_reduce
    _world_all_reduce = run


def all_reduce(array: Any, op: ReduceOp = ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce every member's array with ``op``; each gets the result in place."""
    run = _world_all_reduce
    if run is not None and group is None and not async_op and type(array) is _ndarray:
        # what _member/_prepare/check_op_dtype check, for a world all_reduce of a NumPy
        # array: a checked (op, dtype), C-contiguous, aligned and writeable ("carray")
        try:
            known = array.dtype in _reduce_checked[op]
        except (KeyError, TypeError):  # a new or unhashable op: the slow path checks it
            known = False
        if known and array.flags.carray:
            try:
                run(array, op)
            except ProcGroupError as exc:
                _name_op(exc, "all_reduce", _world().world)
                raise
            return None
    g = _member(group, "all_reduce")
    p = _prepare(g, array, "array", "all_reduce", writable=True)
    check_op_dtype(op, p.dtype)
    if type(p.original) is np.ndarray and p.native is p.original:
        _reduce_checked[op].add(p.dtype)
    return _execute(g, "all_reduce", (p.native, op), [p], async_op)


def reduce(array: Any, dst: int, op: ReduceOp = ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce every member's array into world rank ``dst``'s; others' stay unchanged."""
    g = _member(group, "reduce")
    root = g.group_rank(dst, "dst")
    p = _prepare(g, array, "array", "reduce", writable=g.rank == root)
    check_op_dtype(op, p.dtype)
    return _execute(g, "reduce", (p.native, root, op), [p] if g.rank == root else [], async_op)


def all_gather(array_list: list[Any], array: Any, group: Any = None, async_op: bool = False) -> Work | None:
    """array_list[i] receives member i's array, on every member."""
    g = _member(group, "all_gather")
    p = _prepare(g, array, "array", "all_gather", writable=False)
    outs = _prepare_list(g, array_list, "array_list", "all_gather", p, writable=True, reads=False)
    return _execute(g, "all_gather", ([o.native for o in outs], p.native), outs, async_op)


def gather(array: Any, gather_list: list[Any] | None = None, dst: int = 0, group: Any = None,
           async_op: bool = False) -> Work | None:
    """World rank ``dst`` receives every member's array into gather_list (only dst passes it)."""
    g = _member(group, "gather")
    root = g.group_rank(dst, "dst")
    p = _prepare(g, array, "array", "gather", writable=False)
    outs: list[_Prepared] = []
    if g.rank == root:
        if gather_list is None:
            raise InvalidArgumentError(f"gather: rank {dst} is dst and must pass gather_list")
        outs = _prepare_list(g, gather_list, "gather_list", "gather", p, writable=True, reads=False)
    elif gather_list:
        raise InvalidArgumentError(f"gather: only dst (rank {dst}) passes gather_list")
    native = [o.native for o in outs] if outs else None
    return _execute(g, "gather", (p.native, native, root), outs, async_op)


def scatter(array: Any, scatter_list: list[Any] | None = None, src: int = 0, group: Any = None,
            async_op: bool = False) -> Work | None:
    """Member i receives scatter_list[i] from world rank ``src`` into ``array``."""
    g = _member(group, "scatter")
    root = g.group_rank(src, "src")
    p = _prepare(g, array, "array", "scatter", writable=True, reads=False)
    ins: list[_Prepared] = []
    if g.rank == root:
        if scatter_list is None:
            raise InvalidArgumentError(f"scatter: rank {src} is src and must pass scatter_list")
        ins = _prepare_list(g, scatter_list, "scatter_list", "scatter", p, writable=False)
    elif scatter_list:
        raise InvalidArgumentError(f"scatter: only src (rank {src}) passes scatter_list")
    native = [i.native for i in ins] if ins else None
    return _execute(g, "scatter", (p.native, native, root), [p], async_op)


def reduce_scatter(output: Any, input_list: list[Any], op: ReduceOp = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Work | None:
    """output = op over members of their input_list[my rank]."""
    g = _member(group, "reduce_scatter")
    p = _prepare(g, output, "output", "reduce_scatter", writable=True, reads=False)
    check_op_dtype(op, p.dtype)
    ins = _prepare_list(g, input_list, "input_list", "reduce_scatter", p, writable=False)
    return _execute(g, "reduce_scatter", (p.native, [i.native for i in ins], op), [p], async_op)


def all_to_all(output_list: list[Any], input_list: list[Any], group: Any = None,
               async_op: bool = False) -> Work | None:
    """output_list[j] receives member j's input_list[my rank]."""
    g = _member(group, "all_to_all")
    if not isinstance(input_list, (list, tuple)) or not input_list:
        raise InvalidArgumentError("all_to_all: input_list must be a non-empty list of arrays")
    ins = _prepare_list(g, input_list, "input_list", "all_to_all", None, writable=False)
    outs = _prepare_list(g, output_list, "output_list", "all_to_all", ins[0], writable=True, reads=False)
    return _execute(g, "all_to_all", ([o.native for o in outs], [i.native for i in ins]), outs, async_op)


def barrier(group: Any = None, async_op: bool = False) -> Work | None:
    """Return once every member has entered the barrier."""
    g = _member(group, "barrier")
    return _execute(g, "barrier", (), [], async_op)


# --------------------------------------------------------------------- groups
def new_group(ranks: Sequence[int] | None = None, backend: str | None = None, timeout: Any = None) -> Group:
    """Create a group of world ``ranks``; every rank of the world calls it, in the same order.

    Members talk over the world's transport (or a new channel of ``backend``); non-members
    get a handle whose ``rank`` is -1 and on which every op raises a clear error.
    """
    st = _world()
    size = st.world.size
    if ranks is None:
        ranks = list(range(size))
    try:
        members = sorted(int(r) for r in ranks)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"new_group: ranks must be a list of ints, got {ranks!r}") from None
    if len(set(members)) != len(members):
        raise InvalidArgumentError(f"new_group: ranks {list(ranks)} contain duplicates")
    for r in members:
        _check_rank(r, size, "new_group")
    if not members:
        raise InvalidArgumentError("new_group: ranks must not be empty")
    secs = st.timeout if timeout is None else config.timeout_seconds(timeout)
    with _state_lock:
        gid = st.next_group_id
        st.next_group_id += 1
    my_rank = members.index(st.world.rank) if st.world.rank in members else -1
    spec = st.world.spec
    channel: DataChannel | None = None
    if my_rank >= 0:
        channel, spec = _group_channel(st, members, my_rank, gid, backend, secs, "group")
    g = Group(members, my_rank, channel, spec, gid)
    st.groups.append(g)
    return g


def _group_channel(st: _State, members: Sequence[int], my_rank: int, gid: int, backend: str | None,
                   timeout: float, label: str) -> tuple[DataChannel, Any]:
    from .rendezvous import PrefixStore

    ctx = ChannelContext(
        rank=my_rank, size=len(members), store=PrefixStore(f"pg/{label}{gid}", st.store), timeout=timeout,
        master_addr=st.master_addr, global_ranks=tuple(members), group_id=gid,
    )
    world_channel = st.world.channel
    if world_channel is None:
        raise NotInitializedError("the world group was destroyed")
    if backend is None or backend.lower() == st.world.backend:
        return world_channel.new_group(list(members), ctx), st.world.spec
    spec, cls = load_channel_class(backend)
    return cls(ctx), spec


def host_group(g: Group) -> Group:
    """``g`` itself when its backend moves host arrays, else a cached tcp side group.

    Object collectives pickle to host bytes; on a CUDA-only world (nccl) they run over
    this side group. Created lazily by the first object collective, which every member
    calls, so the creation is collective too.
    """
    if arrays.CPU in _devices(g):
        return g
    if g.host_group is None:
        st = _world()
        channel, spec = _group_channel(st, g.ranks, g.rank, g.group_id, "tcp", st.timeout, "host")
        g.host_group = Group(g.ranks, g.rank, channel, spec, g.group_id)
    return g.host_group


__all__ = [
    "Backend",
    "GroupMember",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "destroy_process_group",
    "gather",
    "get_backend",
    "get_rank",
    "get_world_size",
    "group",
    "host_group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
]
