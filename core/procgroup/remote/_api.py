"""The master-worker API: init_master_worker, nodes, constructors, run, collectives across
nodes, synchronization, memory, streams and events."""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .. import _lifecycle, _state
from ..errors import CommTimeoutError, InvalidArgumentError, ProcGroupError
from ..ops import ReduceOp
from . import _master, _meta, _worker
from . import _protocol as P
from ._array import (
    FUNCTIONS,
    RemoteArray,
    RemoteValue,
    _conv,
    _device_arg,
    _issue,
    _placement,
    in_executor,
    pickled_function,
)
from ._master import INLINE_SEND, SMALL_BYTES, Master, NodeLink, master
from ._protocol import Command, Ref


# --------------------------------------------------------------------- joining
def init_master_worker(backend: str | None = None, init_method: str | None = None, *, world_size: int = -1,
                       rank: int = -1, group_name: str = "", timeout: Any = None, store: Any = None,
                       options: Any = None, token: str | bytes | None = None) -> None:
    """Join the job in master-worker mode (the same arguments as init_process_group).

    Rank 0 returns and is the master. Every other rank serves it as node ``rank - 1`` and
    never returns: it ends when the master calls destroy_process_group() or exits (exit
    status 0), or dies (status 1, with a message naming the master).
    """
    _lifecycle.init_process_group(backend, init_method, world_size=world_size, rank=rank, group_name=group_name,
                                  timeout=timeout, store=store, options=options, token=token)
    st = _state.world()
    me, size = st.world.rank, st.world.size
    workers = tuple(range(1, size))
    workers_group = _lifecycle.new_group(list(workers)) if size > 1 else None
    if me != 0:
        code = 1
        try:
            code = _worker.serve_forever(me - 1, me, st.timeout, workers_group)
        finally:
            _end_worker(code)
    channel = _lifecycle.group_channel(None, "init_master_worker")
    infos = []
    buf = np.empty(P.FRAME, np.uint8)
    for r in workers:
        _, payload = P.recv_payload(channel, buf, r, P.HELLO_TAG)
        infos.append(pickle.loads(payload))  # from a worker: an authenticated member of the job
    _master.MASTER = Master(channel, infos, st.timeout, workers)
    if _master.teardown not in _state.teardown_hooks:
        _state.teardown_hooks.append(_master.teardown)
    bad = [f"node {info['node']} (rank {info['node'] + 1}): {info['setting_error']}" for info in infos
           if info.get("setting_error")]
    if bad:  # end the job cleanly (the workers exit 0), then say why
        _lifecycle.destroy_process_group()
        raise InvalidArgumentError("init_master_worker: a worker's setting is invalid: " + "; ".join(bad))


def _end_worker(code: int) -> None:
    """A worker's end: leave the group, flush, and exit without running the script on.

    The process ends with os._exit, so no code after init_master_worker runs. Under
    mpiexec the process must end through the interpreter's own shutdown (mpi4py
    finalizes MPI there; a process that finalized and then called os._exit was killed
    by Hydra with the whole job about one time in ten), so there it raises SystemExit:
    ``finally`` blocks around the call then run on the workers too.
    """
    try:
        _lifecycle.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the worker exits next, whatever the teardown raised
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop the exit
            pass
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        try:
            running = mpi.Is_initialized() and not mpi.Is_finalized()
        except Exception:  # noqa: BLE001 - an MPI that cannot say is not finalized here
            running = False
        if running:
            raise SystemExit(code)
    os._exit(code)


def num_nodes() -> int:
    """The number of worker nodes (world size - 1); node k is world rank k + 1."""
    return len(master().links)


def current_node() -> int:
    return master().local.node


def set_node(node: int) -> None:
    """Make ``node`` the current node of this thread (where constructors put arrays)."""
    m = master()
    m.local.node = m.link(node).node


@contextlib.contextmanager
def node(k: int) -> Iterator[None]:
    """``with pg.node(k):`` runs the block with node k current."""
    m = master()
    before = m.local.node
    m.local.node = m.link(k).node
    try:
        yield
    finally:
        m.local.node = before


# --------------------------------------------------------------------- constructors
def _target(node_: int | None, device: int) -> tuple[Master, Any, int]:
    m = master()
    link = m.link(node_)
    device = _device_arg(device)
    link.check_device(device)
    return m, link, device


def _construct(fname: str, shape: tuple[int, ...], dtype: np.dtype, fargs: tuple[Any, ...],
               fkwargs: dict[str, Any], node_: int | None, device: int) -> RemoteArray:
    m, link, device = _target(node_, device)
    _meta.check_alloc(shape, dtype)
    out = RemoteArray(m, link.node, device, shape, dtype)
    _issue(m, link, Command.NEW.value, (out,), (), out.nbytes <= SMALL_BYTES, (fname, fargs, fkwargs, device))
    return out


def empty(shape: Any, dtype: Any = float, *, node: int | None = None, device: int = -1) -> RemoteArray:
    shape, dt = _meta.normalize_shape(shape), np.dtype(dtype)
    return _construct("empty", shape, dt, (shape,), {"dtype": dt.str}, node, device)


def zeros(shape: Any, dtype: Any = float, *, node: int | None = None, device: int = -1) -> RemoteArray:
    shape, dt = _meta.normalize_shape(shape), np.dtype(dtype)
    return _construct("zeros", shape, dt, (shape,), {"dtype": dt.str}, node, device)


def ones(shape: Any, dtype: Any = float, *, node: int | None = None, device: int = -1) -> RemoteArray:
    shape, dt = _meta.normalize_shape(shape), np.dtype(dtype)
    return _construct("ones", shape, dt, (shape,), {"dtype": dt.str}, node, device)


def full(shape: Any, fill_value: Any, dtype: Any = None, *, node: int | None = None, device: int = -1) -> RemoteArray:
    shape = _meta.normalize_shape(shape)
    dt = _meta.full_dtype(fill_value, dtype)
    if np.ndim(fill_value):
        np.broadcast_shapes(np.shape(fill_value), shape)
        fill_value = np.asarray(fill_value)
    return _construct("full", shape, dt, (shape, _conv(fill_value, 0, -1)), {"dtype": dt.str}, node, device)


def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None, *, node: int | None = None,
           device: int = -1) -> RemoteArray:
    shape, dt = _meta.arange(start, stop, step, dtype)
    args = tuple(v for v in (start, stop, step) if v is not None) if step is not None or stop is not None \
        else (start,)
    if stop is None and step is not None:
        args = (0, start, step)
    return _construct("arange", shape, dt, _conv(args, 0, -1), {"dtype": dt.str}, node, device)


def _like(a: Any, dtype: Any, shape: Any, node_: int | None, device: int | None) -> tuple[Any, np.dtype, int | None, int]:
    if not isinstance(a, RemoteArray):
        a = np.asarray(a)
    dt = a.dtype if dtype is None else np.dtype(dtype)
    shp = a.shape if shape is None else _meta.normalize_shape(shape)
    if node_ is None and isinstance(a, RemoteArray):
        node_ = a.node
    if device is None:
        device = a.device if isinstance(a, RemoteArray) else -1
    return shp, dt, node_, device


def empty_like(a: Any, dtype: Any = None, shape: Any = None, *, node: int | None = None,
               device: int | None = None) -> RemoteArray:
    shp, dt, n, d = _like(a, dtype, shape, node, device)
    return empty(shp, dt, node=n, device=d)


def zeros_like(a: Any, dtype: Any = None, shape: Any = None, *, node: int | None = None,
               device: int | None = None) -> RemoteArray:
    shp, dt, n, d = _like(a, dtype, shape, node, device)
    return zeros(shp, dt, node=n, device=d)


def ones_like(a: Any, dtype: Any = None, shape: Any = None, *, node: int | None = None,
              device: int | None = None) -> RemoteArray:
    shp, dt, n, d = _like(a, dtype, shape, node, device)
    return ones(shp, dt, node=n, device=d)


def full_like(a: Any, fill_value: Any, dtype: Any = None, shape: Any = None, *, node: int | None = None,
              device: int | None = None) -> RemoteArray:
    shp, dt, n, d = _like(a, dtype, shape, node, device)
    return full(shp, fill_value, dt, node=n, device=d)


FUNCTIONS.update({np.empty_like: empty_like, np.zeros_like: zeros_like, np.ones_like: ones_like,
                  np.full_like: full_like})


def send(array: Any, *, node: int | None = None, device: int = -1) -> RemoteArray:
    """Copy a local array to a node; returns once ``array`` may be reused."""
    m, link, device = _target(node, device)
    src = np.ascontiguousarray(array)
    if src.dtype.kind not in "biufc":
        raise TypeError(f"remote.send: arrays of dtype {src.dtype} cannot be sent (numbers and booleans can)")
    out = RemoteArray(m, link.node, device, src.shape, src.dtype)
    sid = m.stream_id(link.node)
    outs = ((out._id, out.shape, out.dtype.str),)
    if src.nbytes <= INLINE_SEND:
        link.issue((Command.PUT.value, sid, outs, (), True, (src.shape, src.dtype.str, device, src.tobytes(), 0, False)))
        return out
    tag = P.transfer_tag(next(m.transfers))
    # a large array waits for the node's READY (its receive posted into the result, on its
    # dispatching thread): the data then lands in place, not in an unexpected-message buffer
    posted = src.nbytes >= P.RENDEZVOUS_BYTES
    with link.lock:
        link.pending.append((Command.PUT.value, sid, outs, (), False, (src.shape, src.dtype.str, device, None, tag, posted)))
        link._flush_locked()
        if not posted:
            P.send_payload(m.channel, link.buf, link.rank, tag, P.FrameKind.VALUE, P.byte_view(src))
            return out
    ready = np.empty(1, np.uint8)
    try:
        m.channel.recv(ready, link.rank, tag)
    except CommTimeoutError as exc:
        raise CommTimeoutError(f"remote.send: node {link.node} (rank {link.rank}) did not take the data: {exc}",
                               op="remote.send", ranks=[link.rank]) from None
    if ready[0] == P.READY:  # else it could not allocate: the array raises at its sync point
        m.channel.send(P.byte_view(src), link.rank, P.data_tag(tag))
    return out


# --------------------------------------------------------------------- run, sync, memory
def _prepare_run(what: str, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 node: int | None) -> tuple[Master, NodeLink, bytes, Any, Any]:
    """run()/run_async()'s checks and placement: (master, link, pickled fn, args, kwargs)
    with the RemoteArray arguments turned into references on the chosen node."""
    if not callable(fn):
        raise TypeError(f"{what}: fn must be callable, got {type(fn).__name__}")
    fn_bytes = pickled_function(fn)
    operands = [x for x in list(args) + list(kwargs.values()) if isinstance(x, RemoteArray)]
    m, link, device = _placement(operands, what, node)
    if node is not None and operands and m.link(node).node != operands[0].node:
        raise InvalidArgumentError(f"{what}: node={node} but the RemoteArray arguments are on node "
                                   f"{operands[0].node}; move them with .to({node}) first")
    return m, link, fn_bytes, _conv(args, link.node, device), _conv(kwargs, link.node, device)


def run(fn: Any, *args: Any, node: int | None = None, **kwargs: Any) -> RemoteArray | RemoteValue:
    """Run the picklable ``fn(*args, **kwargs)`` on a node (default: the node of the
    RemoteArray arguments, else the current node); RemoteArray arguments arrive as the
    worker's arrays. Waits until fn has run: returns a RemoteArray when it returned an
    array (its data stays on the worker), else a RemoteValue whose .get() fetches it."""
    m, link, fn_bytes, fargs, fkwargs = _prepare_run("remote.run", fn, args, kwargs, node)
    id_ = next(m.ids)
    sid = m.stream_id(link.node)
    meta = link.request(lambda tag: (Command.RUN.value, sid, ((id_, None, None),), (), False, (fn_bytes, fargs, fkwargs, tag)),
                        "remote.run")
    if meta[0] == "array":
        return RemoteArray(m, link.node, int(meta[3]), tuple(meta[1]), np.dtype(meta[2]), id_=id_)
    return RemoteValue(m, link.node, id_)


def run_async(fn: Any, *args: Any, node: int | None = None, **kwargs: Any) -> RemoteValue:
    """Like run() but returns at once: a RemoteValue whose .get() waits for fn and returns
    its result (an array result is copied to the master). fn runs on the node's current
    stream, in order with the other operations of that stream."""
    m, link, fn_bytes, fargs, fkwargs = _prepare_run("remote.run_async", fn, args, kwargs, node)
    id_ = next(m.ids)
    link.issue((Command.RUN.value, m.stream_id(link.node), ((id_, None, None),), (), False, (fn_bytes, fargs, fkwargs, None)))
    return RemoteValue(m, link.node, id_)


def synchronize(node: int | None = None) -> None:
    """Wait until every stream of ``node`` (default: the current node) ran what was issued;
    raise RemoteError for failures not reported yet."""
    _synchronize(master().link(node))


async def synchronize_async(node: int | None = None) -> None:
    """:func:`synchronize` for asyncio: ``await remote.synchronize_async()`` waits without
    blocking the event loop."""
    await in_executor(_synchronize, master().link(node))


def _synchronize(link: NodeLink) -> None:
    link.request(lambda tag: (Command.SYNCHRONIZE.value, tag), "synchronize")


def memory_info(node: int | None = None) -> dict[str, int]:
    """{"arrays": n, "bytes": b, "cached_bytes": c}: the arrays ``node`` holds for the
    master and their bytes (distinct buffers), and the bytes of freed blocks its cache
    keeps for reuse (after its streams ran what was issued)."""
    link = master().link(node)
    return dict(link.request(lambda tag: (Command.MEMORY_INFO.value, tag), "memory_info"))


def empty_cache(node: int | None = None) -> None:
    """Free the blocks that ``node``'s cache keeps for reuse, like torch.cuda.empty_cache
    (arrays in use stay); after its streams ran what was issued, so arrays dropped before
    the call are released too (if nothing there still uses them)."""
    link = master().link(node)
    link.request(lambda tag: (Command.EMPTY_CACHE.value, tag), "empty_cache")


# --------------------------------------------------------------------- across nodes
def _one_per_node(arrays: Sequence[Any], op: str) -> list[RemoteArray]:
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise InvalidArgumentError(f"{op}: arrays must be a non-empty list with one RemoteArray per node")
    for a in arrays:
        if not isinstance(a, RemoteArray):
            raise InvalidArgumentError(f"{op}: arrays must be RemoteArrays, got {type(a).__name__}")
    nodes = [a.node for a in arrays]
    if len(set(nodes)) != len(nodes):
        raise InvalidArgumentError(f"{op}: two arrays are on the same node (nodes {nodes}); pass one per node")
    first = arrays[0]
    for a in arrays[1:]:
        if a.shape != first.shape or a.dtype != first.dtype:
            raise InvalidArgumentError(
                f"{op}: every array must have the same shape and dtype: node {first.node} has {first.shape} "
                f"{first.dtype}, node {a.node} has {a.shape} {a.dtype}")
    return list(arrays)


def _collective(what: str, arrays: Sequence[Any], arg: Any) -> None:
    arrays = _one_per_node(arrays, f"remote.{what}")
    m = arrays[0]._master
    ranks = tuple(sorted(a.node + 1 for a in arrays))
    m.ensure_group(ranks)
    for a in arrays:
        link = m.link(a.node)
        _issue(m, link, Command.COLLECTIVE.value, (), (Ref(a._id),), False, (what, ranks, Ref(a._id), arg, a.shape, a.dtype.str))
    for a in arrays:
        m.link(a.node).flush()


def all_reduce(arrays: Sequence[Any], op: ReduceOp = ReduceOp.SUM) -> None:
    """Reduce one RemoteArray per node in place, with a collective of the job's backend
    among those workers (asynchronous like every op; the arrays hold the result after)."""
    if not isinstance(op, ReduceOp):
        raise InvalidArgumentError(f"remote.all_reduce: op must be a procgroup.ReduceOp, got {op!r}")
    from ..ops import check_op_dtype

    if arrays and isinstance(arrays[0], RemoteArray):
        check_op_dtype(op, arrays[0].dtype)
    _collective("all_reduce", arrays, op.value)


def broadcast(arrays: Sequence[Any], src_node: int) -> None:
    """Copy node ``src_node``'s array into the others (one RemoteArray per node), in place."""
    arrays = _one_per_node(arrays, "remote.broadcast")
    if src_node not in [a.node for a in arrays]:
        raise InvalidArgumentError(f"remote.broadcast: src_node={src_node} holds none of the arrays "
                                   f"(nodes {[a.node for a in arrays]})")
    _collective("broadcast", arrays, src_node + 1)


# --------------------------------------------------------------------- streams and events
class Stream:
    """A queue of operations on one node, like torch.cuda.Stream: one stream runs in
    order; different streams of a node may overlap. ``with stream:`` makes it current (and
    its node the current node)."""

    def __init__(self, node: int | None = None, priority: int = 0) -> None:
        m = master()
        link = m.link(node)
        self._master = m
        self.node = link.node
        self.id = next(link.next_stream)

    @classmethod
    def _default(cls, m: Master, node_: int, sid: int) -> Stream:
        s = cls.__new__(cls)
        s._master, s.node, s.id = m, node_, sid
        return s

    def __enter__(self) -> Stream:
        loc = self._master.local
        loc.streams.setdefault(self.node, []).append(self.id)
        if not hasattr(self, "_saved"):
            self._saved: list[int] = []
        self._saved.append(loc.node)
        loc.node = self.node
        return self

    def __exit__(self, *exc: object) -> None:
        loc = self._master.local
        loc.streams[self.node].pop()
        loc.node = self._saved.pop()

    def synchronize(self) -> None:
        """Wait until this stream ran everything issued to it; raise its failures."""
        sid = self.id
        self._master.link(self.node).request(lambda tag: (Command.STREAM_SYNCHRONIZE.value, sid, (), (), True, (tag,)),
                                                           "Stream.synchronize")

    async def synchronize_async(self) -> None:
        """:meth:`synchronize` for asyncio: waits without blocking the event loop."""
        await in_executor(self.synchronize)

    def query(self) -> bool:
        sid = self.id
        return bool(self._master.link(self.node).request(lambda tag: (Command.STREAM_QUERY.value, sid, tag), "Stream.query"))

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and (other.node, other.id) == (self.node, self.id)

    def __hash__(self) -> int:
        return hash((self.node, self.id))

    def __repr__(self) -> str:
        return f"<procgroup.Stream {self.id} of node {self.node}>"


def current_stream(node: int | None = None) -> Stream:
    m = master()
    link = m.link(node)
    return Stream._default(m, link.node, m.stream_id(link.node))


def default_stream(node: int | None = None) -> Stream:
    m = master()
    return Stream._default(m, m.link(node).node, 0)


class Event:
    """A marker in a stream, like torch.cuda.Event: record(), wait() (the stream waits,
    the master does not), synchronize(), query(), elapsed_time(end) in milliseconds."""

    def __init__(self, enable_timing: bool = True, blocking: bool = False, interprocess: bool = False) -> None:
        self._master = master()
        self._id = next(self._master.ids)
        self.node: int | None = None

    def record(self, stream: Stream | None = None) -> None:
        m = self._master
        s = current_stream() if stream is None else stream
        if self.node is not None and s.node != self.node:
            raise InvalidArgumentError(f"Event.record: this event belongs to node {self.node}; a stream of node "
                                       f"{s.node} cannot record it (use another Event)")
        self.node = s.node
        m.link(s.node).issue((Command.RECORD_EVENT.value, s.id, (), (), True, (self._id,)))

    def wait(self, stream: Stream | None = None) -> None:
        if self.node is None:
            return
        s = current_stream(self.node) if stream is None else stream
        if s.node != self.node:
            raise InvalidArgumentError(f"Event.wait: the event was recorded on node {self.node}; a stream of node "
                                       f"{s.node} cannot wait for it (synchronize() on the master, or move data)")
        self._master.link(s.node).issue((Command.WAIT_EVENT.value, s.id, (), (), False, (self._id,)))

    def query(self) -> bool:
        if self.node is None:
            return True
        eid = self._id
        return bool(self._master.link(self.node).request(lambda tag: (Command.EVENT_QUERY.value, eid, tag), "Event.query"))

    def synchronize(self) -> None:
        """Wait until the work recorded before this event ran (at once if never recorded)."""
        if self.node is None:
            return
        eid = self._id
        self._master.link(self.node).request(lambda tag: (Command.EVENT_SYNCHRONIZE.value, (eid,), tag),
                                                   "Event.synchronize")

    async def synchronize_async(self) -> None:
        """:meth:`synchronize` for asyncio: waits without blocking the event loop."""
        await in_executor(self.synchronize)

    def elapsed_time(self, end_event: Event) -> float:
        if self.node is None or end_event.node is None:
            raise ProcGroupError("Event.elapsed_time: both events must be recorded first")
        if end_event.node != self.node:
            raise InvalidArgumentError(f"Event.elapsed_time: the events are on nodes {self.node} and {end_event.node}")
        ids = (self._id, end_event._id)
        return float(self._master.link(self.node).request(lambda tag: (Command.EVENT_SYNCHRONIZE.value, ids, tag),
                                                               "Event.elapsed_time"))

    def __del__(self) -> None:
        m = getattr(self, "_master", None)
        if m is not None and not m.closed and self.node is not None:
            try:
                m.links[self.node].frees.append(self._id)
            except Exception:  # noqa: BLE001 - never raise from a finalizer
                pass

    def __repr__(self) -> str:
        return f"<procgroup.Event on node {self.node}>"


__all__ = [
    "Event", "RemoteArray", "RemoteValue", "Stream", "all_reduce", "arange", "broadcast", "current_node",
    "current_stream", "default_stream", "empty", "empty_cache", "empty_like", "full", "full_like",
    "init_master_worker", "memory_info", "node", "num_nodes", "ones", "ones_like", "run", "run_async", "send",
    "set_node", "synchronize", "synchronize_async", "zeros", "zeros_like",
]
