"""The public ops: validate locally, translate ranks, stage arrays, call the channel.

Every call checks its arguments before anything is sent, translates world ranks to
group ranks, stages CUDA arrays through host memory for CPU-only backends, and then
runs the op on the group's channel: ``channel.run`` when blocking, ``channel.start``
(a Work) with ``async_op=True``.
"""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any, cast
from collections.abc import Callable, Sequence

import numpy as np

from . import _state
from ._staging import Prepared, copy_back, prepare, prepare_list
from .backend import MAX_USER_TAG, CompletedWork, DataChannel, MappedWork, Work, _recorder
from ._settings import timeout_seconds
from .errors import CommTimeoutError, InvalidArgumentError, ProcGroupError, UnsupportedOperationError
from .groups import Group, GroupArg
from ._torch_args import member_or_none, root_rank, torch_names, world_rank
from .ops import ReduceOp, check_op_dtype


def _execute(g: Group, op: str, args: tuple[Any, ...], written: Sequence[Prepared], async_op: bool) -> Work | None:
    """Run collective ``op`` on ``g``'s channel, now or as a Work; copy staged results back."""
    channel: Any = g.channel  # member() checked it is there
    then = copy_back(written)
    try:
        if channel.uniform_failure:  # completes before it returns, async_op or not
            channel.run_uniform(op, *args)
        elif async_op:
            work = channel.start(op, *args)
            return MappedWork(work, then=then) if then is not None else work
        else:
            channel.run(op, *args)
    except ProcGroupError as exc:
        _name_op(exc, op, g)
        raise
    if then is not None:
        then()
    return CompletedWork(op) if async_op else None


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


def _p2p(op: str, array: Any, rank: int | None, group: Any, tag: int,
         group_rank: int | None) -> tuple[Group, DataChannel, int | None, Prepared] | None:
    """(group, channel, peer's group rank or None for any source, prepared array); None
    when this rank is not in ``group`` (torch: a warning, nothing sent)."""
    g = member_or_none(group, op)
    if g is None:
        return None
    _check_tag(tag, op)
    receiving = op.endswith("recv")
    what = "src" if receiving else "dst"
    rank = world_rank(g, rank, group_rank, what, op)
    if rank is None and not receiving:
        raise InvalidArgumentError(f"{op}: pass dst (a world rank) or group_dst (a rank in the group)")
    peer = None if rank is None else _peer(g, rank, what, op)
    p = prepare(g, array, "tensor", op, writable=receiving, reads=not receiving)
    return g, g.channel, peer, p  # type: ignore[return-value]  # a member's channel is set (member_or_none checked)


_ndarray = np.ndarray
_ns = time.perf_counter_ns
#: the value of a public op's first parameter when the caller did not pass it (then an
#: older keyword spelling may carry it: the renaming path sorts that out)
_MISSING: Any = object()
#: the default tag: ``tag is _TAG0`` proves an int in range in one identity test (CPython
#: keeps one object for each small int), the full check runs for any other tag
_TAG0 = 0


class FastPath:
    """A group's fast paths while its channel takes host arrays (``Group.fast``): the
    channel's blocking callables, cached, the rank translation, and what the op functions
    need to write the flight recorder's entry themselves (procgroup.backend._recorder:
    ``*_spec`` is None when the recorder is off or the callable records itself)."""

    __slots__ = ("send", "recv", "all_reduce", "peers", "ranks", "channel", "append", "coll", "p2p",
                 "send_spec", "recv_spec", "all_reduce_spec")

    def __init__(self, g: Group) -> None:
        channel: Any = g.channel
        self.channel = channel
        # world rank -> group rank of the group's other members: one subscript answers both
        # "is it a member" and "is it not this process" (a miss takes the checked path,
        # which names the problem)
        self.peers: dict[int, int] = {r: i for i, r in enumerate(g.ranks) if i != g.rank}
        self.ranks: tuple[int, ...] = g.ranks  # group rank -> world rank
        # the callables unrecorded: the op functions write the entry (one frame fewer per op)
        self.send: Callable[[Any, int, int], None] = channel.blocking("send", recorded=False)
        self.recv: Callable[[Any, int | None, int], int] = channel.blocking("recv", recorded=False)
        uniform = channel.uniform_failure  # its all_reduce ends with the survivors' agreement
        self.all_reduce: Callable[[Any, ReduceOp], None] = (
            functools.partial(channel.run_uniform, "all_reduce") if uniform
            else channel.blocking("all_reduce", recorded=False))
        rec = _recorder.RECORDER
        info = channel._flight_info
        on = rec.size > 0
        self.append = rec.ring.append
        self.coll = info.coll_seq
        self.p2p = info.p2p_seq
        self.send_spec = (info, "send") if on else None
        self.recv_spec = (info, "recv") if on else None
        # run_uniform runs the op through the channel's own recorded callable
        self.all_reduce_spec = (info, "all_reduce") if on and not uniform else None


#: The world group's FastPath (set by bind_world), and the dtypes prepare() let through.
_world_fast: FastPath | None = None
_p2p_dtypes: set[np.dtype] = set()


def bind_group(g: Group) -> None:
    """Give ``g`` its fast paths (a member whose channel takes host arrays; all_reduce's
    ends with the survivors' agreement when the channel has ``uniform_failure``)."""
    g.fast = FastPath(g)


def _fast_failed(f: FastPath, entry: tuple[Any, ...], exc: BaseException, op: str, group: Any) -> None:
    """A fast path's op raised: the flight recorder notes it (and explains a procgroup
    error), then the error is prefixed with the op and group as on the checked path."""
    _recorder.failed(f.channel, entry, exc)
    if isinstance(exc, ProcGroupError):
        _name_op(exc, op, _state.resolve(group))


def _remember_dtype(p: Prepared) -> None:
    if type(p.original) is _ndarray and p.native is p.original:
        _p2p_dtypes.add(p.dtype)


def _renaming(body: Callable[..., Any], name: str, aliases: dict[str, str]) -> Callable[..., Any]:
    """``body`` (a public op's checked path, with torch's signature) accepting procgroup's
    older keyword spellings ``aliases``, for calls that use them (torch_names)."""
    body.__name__ = body.__qualname__ = name  # what torch_names' errors call it
    return torch_names(aliases)(body)


def _public(fn: Callable[..., Any], body: Callable[..., Any], aliases: dict[str, str]) -> None:
    """Make ``fn`` (a public op whose fast path comes first, taking older spellings through
    ``**_aliases``) look like ``body``: torch's signature, the docstring, the aliases."""
    fn.__signature__ = inspect.signature(body)  # type: ignore[attr-defined]  # read by inspect
    fn.__doc__ = body.__doc__
    fn.__procgroup_aliases__ = dict(aliases)  # type: ignore[attr-defined]  # read back by the docs and tests


def _given(tensor: Any) -> tuple[Any, ...]:
    return () if tensor is _MISSING else (tensor,)


# Each public op below that has a fast path (send, recv, all_reduce: the calls whose fixed
# cost decides small-message latency) is written as one function, with no decorator's
# frame: for a native NumPy array of a dtype prepare() has already let through, it does
# what member/prepare check inline, writes the flight recorder's entry (the local
# ``entry``: _recorder.holds_entry) and calls the channel; anything else takes the checked
# path (``_send`` ...), through torch_names when an older keyword spelling is used.
def _send(tensor: Any, dst: int | None = None, group: GroupArg = None, tag: int = 0,
          group_dst: int | None = None) -> None:
    """Send ``tensor`` to world rank ``dst`` (or group rank ``group_dst``); blocks until the
    buffer may be reused."""
    found = _p2p("send", tensor, dst, group, tag, group_dst)
    if found is None:
        return
    g, channel, peer, p = found
    try:
        channel.send(p.native, cast(int, peer), tag)
    except ProcGroupError as exc:
        _name_op(exc, "send", g)
        raise
    _remember_dtype(p)


_send_renaming = _renaming(_send, "send", {"array": "tensor"})


def send(tensor: Any = _MISSING, dst: int | None = None, group: GroupArg = None, tag: int = 0,
         group_dst: int | None = None, **_aliases: Any) -> None:
    f = _world_fast if group is None else group.fast if type(group) is Group else None
    if (f is not None and type(tensor) is _ndarray and type(dst) is int
            and (tag is _TAG0 or type(tag) is int and 0 <= tag < MAX_USER_TAG)
            and group_dst is None and not _aliases):
        try:
            peer = f.peers[dst]
        except KeyError:  # not another member of the group: the checked path says so
            pass
        else:
            dtype = tensor.dtype
            if dtype in _p2p_dtypes and tensor.flags.c_contiguous:
                spec = f.send_spec
                if spec is None:
                    try:
                        f.send(tensor, peer, tag)
                    except ProcGroupError as exc:
                        _name_op(exc, "send", _state.resolve(group))
                        raise
                    return
                entry = (spec, next(f.p2p), peer, tensor.nbytes, dtype, _ns())
                f.append(entry)
                try:
                    f.send(tensor, peer, tag)
                except BaseException as exc:
                    _fast_failed(f, entry, exc, "send", group)
                    raise
                return
    if _aliases or tensor is _MISSING:
        return _send_renaming(*_given(tensor), dst=dst, group=group, tag=tag, group_dst=group_dst,
                              **_aliases)
    return _send(tensor, dst, group, tag, group_dst)


def _recv(tensor: Any, src: int | None = None, group: GroupArg = None, tag: int = 0,
          group_src: int | None = None) -> int:
    """Receive into ``tensor`` from world rank ``src`` (or group rank ``group_src``; any rank
    when neither is given); returns the sender's world rank (-1 on a non-member, as torch)."""
    found = _p2p("recv", tensor, src, group, tag, group_src)
    if found is None:
        return -1
    g, channel, peer, p = found
    try:
        sender = channel.recv(p.native, peer, tag)
    except ProcGroupError as exc:
        _name_op(exc, "recv", g)
        raise
    then = copy_back([p])
    if then is not None:
        then()
    _remember_dtype(p)
    return g.global_rank(sender)


_recv_renaming = _renaming(_recv, "recv", {"array": "tensor"})


def recv(tensor: Any = _MISSING, src: int | None = None, group: GroupArg = None, tag: int = 0,
         group_src: int | None = None, **_aliases: Any) -> int:
    f = _world_fast if group is None else group.fast if type(group) is Group else None
    if (f is not None and type(tensor) is _ndarray and (src is None or type(src) is int)
            and (tag is _TAG0 or type(tag) is int and 0 <= tag < MAX_USER_TAG)
            and group_src is None and not _aliases):
        try:
            peer = None if src is None else f.peers[src]  # None: any source
        except KeyError:  # not another member of the group: the checked path says so
            pass
        else:
            dtype = tensor.dtype
            if dtype in _p2p_dtypes and tensor.flags.carray:
                spec = f.recv_spec
                if spec is None:
                    try:
                        return f.ranks[f.recv(tensor, peer, tag)]
                    except ProcGroupError as exc:
                        _name_op(exc, "recv", _state.resolve(group))
                        raise
                entry = (spec, next(f.p2p), peer, tensor.nbytes, dtype, _ns())
                f.append(entry)
                try:
                    return f.ranks[f.recv(tensor, peer, tag)]
                except BaseException as exc:
                    _fast_failed(f, entry, exc, "recv", group)
                    raise
    if _aliases or tensor is _MISSING:
        return _recv_renaming(*_given(tensor), src=src, group=group, tag=tag, group_src=group_src,
                              **_aliases)
    return _recv(tensor, src, group, tag, group_src)


_public(send, _send, {"array": "tensor"})
_public(recv, _recv, {"array": "tensor"})


@torch_names({"array": "tensor"})
def isend(tensor: Any, dst: int | None = None, group: GroupArg = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor``; don't touch it until the returned Work is waited on."""
    found = _p2p("isend", tensor, dst, group, tag, group_dst)
    if found is None:
        return None
    _, channel, peer, p = found
    return channel.isend(p.native, cast(int, peer), tag)


@torch_names({"array": "tensor"})
def irecv(tensor: Any, src: int | None = None, group: GroupArg = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor``; ``Work.source_rank()`` is the sender after wait()."""
    found = _p2p("irecv", tensor, src, group, tag, group_src)
    if found is None:
        return None
    g, channel, peer, p = found
    return MappedWork(channel.irecv(p.native, peer, tag), mapping=g.global_rank, then=copy_back([p]))


# --------------------------------------------------------------------- collectives
@torch_names({"array": "tensor"})
def broadcast(tensor: Any, src: int | None = None, group: GroupArg = None, async_op: bool = False,
              group_src: int | None = None) -> Work | None:
    """Copy world rank ``src``'s (or group rank ``group_src``'s) tensor into every member's."""
    g = member_or_none(group, "broadcast")
    if g is None:
        return None
    root = root_rank(g, src, group_src, "src", "broadcast")
    p = prepare(g, tensor, "tensor", "broadcast", writable=True, reads=g.rank == root)
    return _execute(g, "broadcast", (p.native, root), [p], async_op)


#: (op, dtype) pairs that passed check_op_dtype for a native NumPy array: all_reduce's
#: fast path (the call whose fixed cost decides small-message latency) takes those.
_reduce_checked: dict[ReduceOp, set[np.dtype]] = {op: set() for op in ReduceOp}


def bind_world(world: Group | None) -> None:
    """Set (None: forget) the world's fast paths, used when no group is passed."""
    global _world_fast
    if world is not None:
        bind_group(world)
    _world_fast = None if world is None else world.fast


def _all_reduce(tensor: Any, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
                async_op: bool = False) -> Work | None:
    """Reduce every member's tensor with ``op``; each gets the result in place."""
    g = member_or_none(group, "all_reduce")
    if g is None:
        return None
    p = prepare(g, tensor, "tensor", "all_reduce", writable=True)
    check_op_dtype(op, p.dtype)
    if type(p.original) is np.ndarray and p.native is p.original:
        _reduce_checked[op].add(p.dtype)
    return _execute(g, "all_reduce", (p.native, op), [p], async_op)


_all_reduce_renaming = _renaming(_all_reduce, "all_reduce", {"array": "tensor"})


def all_reduce(tensor: Any = _MISSING, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
               async_op: bool = False, **_aliases: Any) -> Work | None:
    f = _world_fast if group is None else group.fast if type(group) is Group else None
    if f is not None and not async_op and type(tensor) is _ndarray and not _aliases:
        # what member/prepare/check_op_dtype check, for an all_reduce of a NumPy
        # array: a checked (op, dtype), C-contiguous, aligned and writeable ("carray")
        dtype = tensor.dtype
        try:
            known = dtype in _reduce_checked[op]
        except (KeyError, TypeError):  # a new or unhashable op: the checked path checks it
            known = False
        if known and tensor.flags.carray:
            spec = f.all_reduce_spec
            if spec is None:
                try:
                    f.all_reduce(tensor, op)
                except ProcGroupError as exc:
                    _name_op(exc, "all_reduce", _state.resolve(group))
                    raise
                return None
            entry = (spec, next(f.coll), None, tensor.nbytes, dtype, _ns())
            f.append(entry)
            try:
                f.all_reduce(tensor, op)
            except BaseException as exc:
                _fast_failed(f, entry, exc, "all_reduce", group)
                raise
            return None
    if _aliases or tensor is _MISSING:
        return _all_reduce_renaming(*_given(tensor), op=op, group=group, async_op=async_op,
                                    **_aliases)
    return _all_reduce(tensor, op, group, async_op)


_public(all_reduce, _all_reduce, {"array": "tensor"})
for _fn in (send, recv, all_reduce):
    _recorder.holds_entry(_fn)


@torch_names({"array": "tensor"})
def reduce(tensor: Any, dst: int | None = None, op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
           async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """Reduce every member's tensor into world rank ``dst``'s (or group rank ``group_dst``'s);
    the others' stay unchanged."""
    g = member_or_none(group, "reduce")
    if g is None:
        return None
    root = root_rank(g, dst, group_dst, "dst", "reduce")
    p = prepare(g, tensor, "tensor", "reduce", writable=g.rank == root)
    check_op_dtype(op, p.dtype)
    return _execute(g, "reduce", (p.native, root, op), [p] if g.rank == root else [], async_op)


@torch_names({"array_list": "tensor_list", "array": "tensor"})
def all_gather(tensor_list: list[Any], tensor: Any, group: GroupArg = None, async_op: bool = False) -> Work | None:
    """tensor_list[i] receives member i's tensor, on every member."""
    g = member_or_none(group, "all_gather")
    if g is None:
        return None
    p = prepare(g, tensor, "tensor", "all_gather", writable=False)
    outs = prepare_list(g, tensor_list, "tensor_list", "all_gather", p, writable=True, reads=False)
    return _execute(g, "all_gather", ([o.native for o in outs], p.native), outs, async_op)


@torch_names({"array": "tensor"})
def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None, group: GroupArg = None,
           async_op: bool = False, group_dst: int | None = None) -> Work | None:
    """World rank ``dst`` (default 0; or group rank ``group_dst``) receives every member's
    tensor into gather_list (only dst passes it)."""
    g = member_or_none(group, "gather")
    if g is None:
        return None
    root = root_rank(g, dst, group_dst, "dst", "gather", default=0)
    p = prepare(g, tensor, "tensor", "gather", writable=False)
    outs: list[Prepared] = []
    if g.rank == root:
        if gather_list is None:
            raise InvalidArgumentError(f"gather: rank {g.global_rank(root)} is dst and must pass gather_list")
        outs = prepare_list(g, gather_list, "gather_list", "gather", p, writable=True, reads=False)
    elif gather_list:
        raise InvalidArgumentError(f"gather: only dst (rank {g.global_rank(root)}) passes gather_list")
    native = [o.native for o in outs] if outs else None
    return _execute(g, "gather", (p.native, native, root), outs, async_op)


@torch_names({"array": "tensor"})
def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None, group: GroupArg = None,
            async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Member i receives scatter_list[i] from world rank ``src`` (default 0; or group rank
    ``group_src``) into ``tensor``."""
    g = member_or_none(group, "scatter")
    if g is None:
        return None
    root = root_rank(g, src, group_src, "src", "scatter", default=0)
    p = prepare(g, tensor, "tensor", "scatter", writable=True, reads=False)
    ins: list[Prepared] = []
    if g.rank == root:
        if scatter_list is None:
            raise InvalidArgumentError(f"scatter: rank {g.global_rank(root)} is src and must pass scatter_list")
        ins = prepare_list(g, scatter_list, "scatter_list", "scatter", p, writable=False)
    elif scatter_list:
        raise InvalidArgumentError(f"scatter: only src (rank {g.global_rank(root)}) passes scatter_list")
    native = [i.native for i in ins] if ins else None
    return _execute(g, "scatter", (p.native, native, root), [p], async_op)


@torch_names()
def reduce_scatter(output: Any, input_list: list[Any], op: ReduceOp = ReduceOp.SUM, group: GroupArg = None,
                   async_op: bool = False) -> Work | None:
    """output = op over members of their input_list[my rank]."""
    g = member_or_none(group, "reduce_scatter")
    if g is None:
        return None
    p = prepare(g, output, "output", "reduce_scatter", writable=True, reads=False)
    check_op_dtype(op, p.dtype)
    ins = prepare_list(g, input_list, "input_list", "reduce_scatter", p, writable=False)
    return _execute(g, "reduce_scatter", (p.native, [i.native for i in ins], op), [p], async_op)


@torch_names({"output_list": "output_tensor_list", "input_list": "input_tensor_list"})
def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: GroupArg = None,
               async_op: bool = False) -> Work | None:
    """output_tensor_list[j] receives member j's input_tensor_list[my rank]."""
    g = member_or_none(group, "all_to_all")
    if g is None:
        return None
    if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
        raise InvalidArgumentError("all_to_all: input_tensor_list must be a non-empty list of tensors")
    ins = prepare_list(g, input_tensor_list, "input_tensor_list", "all_to_all", None, writable=False)
    outs = prepare_list(g, output_tensor_list, "output_tensor_list", "all_to_all", ins[0], writable=True,
                        reads=False)
    return _execute(g, "all_to_all", ([o.native for o in outs], [i.native for i in ins]), outs, async_op)


@torch_names()
def barrier(group: GroupArg = None, async_op: bool = False, device_ids: list[int] | None = None,
            timeout: Any = None) -> Work | None:
    """Return once every member has entered the barrier; ``timeout`` (seconds or a
    timedelta) bounds this wait instead of the group's timeout. ``device_ids`` (torch's
    hint for NCCL) is accepted and not needed.

    When ``timeout`` expires the barrier is still in flight on the members that entered
    it, and a later collective would pair with it; so, as torch aborts a communicator on
    a timeout, the group is given up: revoked when its backend can (every member's pending
    and later ops fail with GroupRevokedError; shrink() it to go on), else broken here
    (every later op on it raises the CommTimeoutError). Do not use the group again.
    ``timeout`` with ``async_op=True`` is refused: bound the wait with ``Work.wait``'s
    own timeout instead (which leaves the group usable only if the wait then completes)."""
    g = member_or_none(group, "barrier")
    if g is None:
        return None
    if device_ids is not None and (not isinstance(device_ids, (list, tuple))
                                   or not all(isinstance(d, int) for d in device_ids)):
        raise InvalidArgumentError(f"barrier: device_ids must be a list of ints, got {device_ids!r}")
    if timeout is None:
        return _execute(g, "barrier", (), [], async_op)
    if async_op:
        raise InvalidArgumentError("barrier: timeout= with async_op=True is not supported (an expired barrier "
                                   "gives the group up, which an async caller cannot see coming); pass "
                                   "async_op=True alone and bound the wait with work.wait(timeout=...)")
    _barrier_within(g, timeout_seconds(timeout))
    return None


def _barrier_within(g: Group, seconds: float) -> None:
    """A blocking barrier that gives up after ``seconds`` with a CommTimeoutError, and
    gives the group up with it: the barrier stays in flight, so the next collective of
    the members that entered it would pair with it (see :func:`barrier`)."""
    work = cast(Work, _execute(g, "barrier", (), [], True))
    try:
        work.wait(timeout=seconds)
    except CommTimeoutError:
        channel = g.channel
        assert channel is not None  # member_or_none checked
        revoked = channel.survives
        after = ("the group is revoked: shrink() it to go on" if revoked else
                 "the group is broken: do not use it again (destroy_process_group, then start anew)")
        error = CommTimeoutError(f"barrier: not every member of {list(g.ranks)} arrived within {seconds:g}s "
                                 f"(barrier's timeout); {after}", op="barrier")
        if revoked:
            channel.revoke()
        else:
            channel.interrupt(error)
        raise error from None


def failure_ack(group: GroupArg = None) -> None:
    """Acknowledge the failures of ``group`` known here now (MPI ULFM's
    ``MPI_Comm_failure_ack``). An any-source receive (``recv(src=None)``) on a group with
    a failed member raises PeerError naming it until the failure is acknowledged; after
    this call it hears the live members again, without a revoke. A death that happens
    later needs a new acknowledgement. Local: nothing is sent; collectives on a group
    holding a dead rank still fail (shrink it to go on)."""
    _acknowledger(group, "failure_ack").failure_ack()


def failure_get_acked(group: GroupArg = None) -> list[int]:
    """The ranks of ``group`` whose failure was acknowledged here with :func:`failure_ack`,
    in the group's numbering, ascending (MPI ULFM's ``MPI_Comm_failure_get_acked``)."""
    return list(_acknowledger(group, "failure_get_acked").failure_get_acked())


def _acknowledger(group: GroupArg, op: str) -> Any:
    """The group's channel, when its backend scopes failures (tcp, gloo, nccl)."""
    channel = _state.group_channel(group, op)
    if not callable(getattr(channel, "failure_ack", None)):
        raise UnsupportedOperationError(
            f"{op}: the {channel.backend_name or 'this'} backend does not scope failures to the operations "
            f"that involve the dead rank (a death breaks its whole group), so there is nothing to acknowledge; "
            f"use revoke/agree/shrink, or the tcp or gloo backend")
    return channel


__all__ = [
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "bind_group",
    "bind_world",
    "broadcast",
    "failure_ack",
    "failure_get_acked",
    "gather",
    "irecv",
    "isend",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
]
