"""The worker side of master-worker mode: receive commands from the master, run them.

One thread (the process's main thread) receives command batches from rank 0 and
dispatches them in order. Each stream is a thread with a queue, so a stream runs its
commands in the order the master issued them, and different streams overlap. Arrays live
in *slots*: a command names arrays by id, and dispatch binds those ids to slot objects
right away, so an array the master frees later stays alive for the commands that still
use it, and an array made on one stream is awaited by a command on another.

Small commands (the master marks them: a few KiB of data, no blocking) run on the
dispatching thread itself when their stream is idle: a small op and its get() cost one
message each way and no thread hand-off.

Large host arrays come from a caching allocator (:mod:`._cache`): the memory of an array
the master freed stays mapped for the next array of its size, once nothing here still
uses it.

A failed command records an :class:`ErrorInfo` on the arrays it would have written; a
command reading such an array passes the error on instead of running; get() and the
synchronizations report it to the master, which raises :class:`procgroup.RemoteError`.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _lifecycle, _ops
from ..errors import CommTimeoutError, InvalidArgumentError, ProcGroupError
from ..ops import ReduceOp
from . import _protocol as P
from ._cache import HostCache, cache_limit
from ._protocol import Command as C
from ._protocol import ErrorInfo, Ref

log = logging.getLogger(__name__)


class Slot:
    """One array (or run() value) on this worker; ``ready`` is set once its producer ran."""

    __slots__ = ("error", "ready", "value")

    def __init__(self) -> None:
        self.value: Any = None
        self.error: ErrorInfo | None = None
        self.ready = threading.Event()


class WorkerEvent:
    __slots__ = ("flag", "t")

    def __init__(self) -> None:
        self.flag = threading.Event()
        self.t = 0.0


class Job:
    __slots__ = ("args", "extra", "inputs", "kind", "meta", "outs", "stream", "writes")

    def __init__(self, kind: str, stream: int, outs: list[Slot], meta: tuple[Any, ...], writes: list[Slot],
                 inputs: list[Slot], args: Any, extra: Any = None) -> None:
        self.kind, self.stream, self.outs, self.meta = kind, stream, outs, meta
        self.writes, self.inputs, self.args, self.extra = writes, inputs, args, extra


class StreamThread:
    def __init__(self, worker: Worker, sid: int) -> None:
        self.sid = sid
        self.q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.enqueued = 0  # written by the dispatcher only
        self.done = 0  # written by this stream's thread only
        self.thread = threading.Thread(target=self._loop, args=(worker,), name=f"procgroup-stream-{sid}", daemon=True)
        self.thread.start()

    @property
    def idle(self) -> bool:
        return self.enqueued == self.done

    def submit(self, job: Job) -> None:
        self.enqueued += 1
        self.q.put(job)

    def _loop(self, worker: Worker) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            try:
                worker.execute(job)
            finally:
                # an idle stream holds no arrays: a freed array's block can go back to
                # the cache (and its memory_info count drop) without waiting for the next job
                job = None
                self.done += 1


#: kinds the dispatcher may run itself when the master marked the command small
_INLINE_KINDS = frozenset({C.NEW, C.PUT, C.UFUNC, C.FUNCTION, C.METHOD, C.GET_ITEM, C.SET_ITEM, C.GET_ARRAY, C.GET_VALUE, C.RECORD_EVENT,
                           C.STREAM_SYNCHRONIZE})


def _cupy() -> Any:
    import cupy

    return cupy


class _NoCtx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


_NOCTX = _NoCtx()


def _xp(device: int) -> tuple[Any, Any]:
    if device < 0:
        return np, _NOCTX
    cp = _cupy()
    return cp, cp.cuda.Device(device)


def _host(value: Any) -> np.ndarray:
    """A C-contiguous host copy (or view) of a worker array."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value)
    return np.ascontiguousarray(_cupy().asnumpy(value))


class Worker:
    def __init__(self, node: int, rank: int, timeout: float, workers_group: Any, cache_bytes: int = 0) -> None:
        self.node, self.rank, self.timeout = node, rank, timeout
        self.cache = HostCache(cache_bytes)
        self.channel = _lifecycle.group_channel(None, "init_master_worker")
        self.slots: dict[int, Slot] = {}
        self.events: dict[int, WorkerEvent] = {}
        self.streams: dict[int, StreamThread] = {}
        self.groups: dict[tuple[int, ...], Any] = {}
        if workers_group is not None:
            self.groups[tuple(workers_group.ranks)] = workers_group
        self.group_issued: dict[tuple[int, ...], int] = {}
        self.group_done: dict[tuple[int, ...], int] = {}
        self.group_cv = threading.Condition()
        self.unreported: list[ErrorInfo] = []
        self.err_lock = threading.Lock()
        self.local = threading.local()
        self.main_buf = np.empty(P.FRAME, np.uint8)

    # ------------------------------------------------------------ plumbing
    def buf(self) -> np.ndarray:
        b = getattr(self.local, "buf", None)
        if b is None:
            b = self.local.buf = np.empty(P.FRAME, np.uint8)
        return b

    def reply(self, tag: int, value: Any) -> None:
        P.send_payload(self.channel, self.buf(), 0, tag, P.FrameKind.VALUE, P.dumps(value))

    def reply_error(self, tag: int, errors: list[ErrorInfo]) -> None:
        for e in errors:
            e.reported = True
        self.send_errors(0, tag, errors)

    def send_errors(self, dst: int, tag: int, errors: list[ErrorInfo]) -> None:
        """An ERRORS frame in place of the array ``dst`` waits for."""
        P.send_payload(self.channel, self.buf(), dst, tag, P.FrameKind.ERRORS, P.dumps([e.as_tuple() for e in errors]))

    def send_array(self, dst: int, tag: int, value: Any) -> None:
        host = _host(value)
        P.send_array(self.channel, self.buf(), dst, tag, P.byte_view(host), rendezvous=True)

    def recv_array(self, src: int, tag: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | list[ErrorInfo]:
        return recv_array(self.channel, self.buf(), src, tag, shape, dtype, self.cache.empty)

    def stream(self, sid: int) -> StreamThread:
        st = self.streams.get(sid)
        if st is None:
            st = self.streams[sid] = StreamThread(self, sid)
        return st

    def record_error(self, job: Job, exc: BaseException, op: str) -> ErrorInfo:
        info = ErrorInfo(self.node, self.rank, op, type(exc).__name__, str(exc),
                         "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), job.stream)
        with self.err_lock:
            self.unreported.append(info)
        return info

    def take_errors(self, stream: int | None = None) -> list[ErrorInfo]:
        with self.err_lock:
            mine = [e for e in self.unreported if not e.reported and (stream is None or e.stream == stream)]
            self.unreported = [e for e in self.unreported if not e.reported and e not in mine]
        return mine

    # ------------------------------------------------------------ dispatch (main thread)
    def bind(self, obj: Any, inputs: list[Slot]) -> Any:
        t = type(obj)
        if t is Ref:
            slot = self.slots.get(obj.id)
            if slot is None:
                raise KeyError(f"array #{obj.id} does not exist on node {self.node} (freed?)")
            inputs.append(slot)
            return slot
        if t is tuple or t is list:
            return t(self.bind(o, inputs) for o in obj)
        if t is dict:
            return {k: self.bind(v, inputs) for k, v in obj.items()}
        return obj

    def dispatch(self, cmd: tuple[Any, ...]) -> bool:
        """Run or queue one command; False once the master said goodbye."""
        kind = cmd[0]
        main = _MAIN.get(kind)
        if main is not None:
            return main(self, *cmd[1:]) is not False
        _, sid, outs, writes, small, args = cmd
        inputs: list[Slot] = []
        outs_slots = []
        for o in outs:
            s = Slot()
            self.slots[o[0]] = s
            outs_slots.append(s)
        write_slots = [self.slots[r.id] for r in writes]
        try:
            bound = self.bind(args, inputs)
        except KeyError as exc:
            bound = None
            job = Job(kind, sid, outs_slots, tuple(o[1:] for o in outs), write_slots, inputs, None)
            info = self.record_error(job, exc, kind)
            for s in outs_slots + write_slots:
                s.error = info
                s.ready.set()
            return True
        job = Job(kind, sid, outs_slots, tuple(o[1:] for o in outs), write_slots, inputs, bound)
        prep = _PREPARE.get(kind)
        if prep is not None:
            prep(self, job)
        st = self.stream(sid)
        if small and st.idle and kind in _INLINE_KINDS and all(s.ready.is_set() for s in inputs):
            self.execute(job)
        else:
            st.submit(job)
        return True

    # ------------------------------------------------------------ execution (stream threads)
    def execute(self, job: Job) -> None:
        try:
            err = None
            for s in job.inputs:
                if not s.ready.is_set() and not s.ready.wait(self.timeout):
                    raise CommTimeoutError(f"an input array was not computed within {self.timeout}s")
                if s.error is not None and err is None:
                    err = s.error
            if err is not None and job.kind not in _HANDLES_ERRORS:
                for s in job.outs + job.writes:
                    s.error = err
                return
            _HANDLERS[job.kind](self, job)
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the master
            info = self.record_error(job, exc, _op_name(job))
            for s in job.outs + job.writes:
                s.error = info
        finally:
            for s in job.outs:
                s.ready.set()

    def store(self, job: Job, results: Any, device: int) -> None:
        if not isinstance(results, tuple):
            results = (results,)
        xp, _ = _xp(device)
        for slot, meta, r in zip(job.outs, job.meta, results):
            arr = xp.asarray(r)
            shape, dtype = meta
            if arr.shape != tuple(shape):
                raise RuntimeError(f"procgroup.remote internal error: the master predicted shape {tuple(shape)}, "
                                   f"the worker got {arr.shape}")
            if arr.dtype != np.dtype(dtype):
                arr = arr.astype(dtype)
            slot.value = arr

    def values(self, obj: Any, device: int) -> Any:
        t = type(obj)
        if t is Slot:
            return obj.value
        if t is tuple or t is list:
            return t(self.values(o, device) for o in obj)
        if t is dict:
            return {k: self.values(v, device) for k, v in obj.items()}
        if device >= 0 and t is np.ndarray:
            return _cupy().asarray(obj)
        return obj

    # ------------------------------------------------------------ the loop
    def serve(self) -> int:
        """Receive and dispatch until the master says goodbye (0) or is gone (1)."""
        buf = self.main_buf
        channel = self.channel
        while True:
            try:
                kind, payload = P.recv_payload(channel, buf, 0, P.CMD_TAG)
            except CommTimeoutError:
                continue  # the master is just quiet
            except BaseException as exc:  # noqa: BLE001 - whatever ends the receive, the master is gone
                return self.master_gone(exc)
            if kind != P.FrameKind.COMMANDS:
                return self.master_gone(ProcGroupError(f"unexpected frame kind {kind} from the master"))
            for cmd in pickle.loads(payload):  # from rank 0 only: an authenticated member of the job
                if not self.dispatch(cmd):
                    return 0

    def master_gone(self, exc: BaseException) -> int:
        sys.stderr.write(f"procgroup master-worker: node {self.node} (rank {self.rank}): the master (rank 0) "
                         f"is gone without ending the job ({type(exc).__name__}: {exc}); this worker ends\n")
        return 1


def recv_array(channel: Any, buf: np.ndarray, src: int, tag: int, shape: tuple[int, ...], dtype: np.dtype,
               alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty) -> np.ndarray | list[ErrorInfo]:
    """Receive an array sent with send_payload or send_array (allocated by ``alloc`` once
    the header said data is coming; for VALUE_AFTER_READY its receive is posted before READY goes
    back), or the sender's errors instead."""
    channel.recv(buf, src, tag)
    kind, n = P.HEADER.unpack_from(buf, 0)
    if kind == P.FrameKind.ERRORS:
        return _read_errors(channel, buf, src, tag, n)
    try:
        out = alloc(shape, dtype)
        target = P.byte_view(out)
        if n != target.nbytes:
            raise ProcGroupError(f"master-worker protocol: expected {target.nbytes} bytes from rank {src}, got {n}")
    except BaseException:
        if n > P.INLINE:  # let the sender go on: no READY for it, or its eager rest taken and dropped
            if kind == P.FrameKind.VALUE_AFTER_READY:
                buf[0] = P.NOT_READY
                channel.send(buf[:1], src, tag)
            else:
                channel.recv(np.empty(n - P.INLINE, np.uint8), src, tag)
        raise
    head = min(n, P.INLINE)
    target[:head] = buf[P.HEADER.size:P.HEADER.size + head]
    if n > P.INLINE:
        if kind == P.FrameKind.VALUE_AFTER_READY:  # post the receive into the result, then let the data come
            work = channel.irecv(target[P.INLINE:], src, tag)
            buf[0] = P.READY
            channel.send(buf[:1], src, tag)
            work.wait()
        else:
            channel.recv(target[P.INLINE:], src, tag)
    return out


def post_array(channel: Any, src: int, tag: int, out: np.ndarray) -> Any:
    """Post the receive of a posted transfer into ``out`` (before the sender may send)."""
    return channel.irecv(P.byte_view(out), src, P.data_tag(tag))


def recv_posted(channel: Any, buf: np.ndarray, src: int, tag: int, out: np.ndarray,
                work: Any) -> np.ndarray | list[ErrorInfo]:
    """After :func:`post_array`: the sender's frame says the data comes into ``out``, or
    its errors came instead (the posted receive is then withdrawn)."""
    try:
        channel.recv(buf, src, tag)
        kind, n = P.HEADER.unpack_from(buf, 0)
        if kind == P.FrameKind.ERRORS:
            if not work.cancel():
                raise ProcGroupError(f"master-worker protocol: rank {src} sent data and errors for one array")
            return _read_errors(channel, buf, src, tag, n)
        if kind != P.FrameKind.VALUE or n != out.nbytes:
            raise ProcGroupError(f"master-worker protocol: expected a frame for {out.nbytes} bytes from rank "
                                 f"{src}, got kind {kind} for {n}")
    except BaseException:
        work.cancel()  # nothing may land in ``out`` after this
        raise
    work.wait()
    return out


def _read_errors(channel: Any, buf: np.ndarray, src: int, tag: int, n: int) -> list[ErrorInfo]:
    payload: Any = buf[P.HEADER.size:P.HEADER.size + min(n, P.INLINE)].tobytes()
    if n > P.INLINE:
        rest = np.empty(n - P.INLINE, np.uint8)
        channel.recv(rest, src, tag)
        payload += rest.tobytes()
    return [ErrorInfo(*t) for t in pickle.loads(payload)]


def _op_name(job: Job) -> str:
    a = job.args
    if job.kind == C.UFUNC:
        return a[0] if a[1] == "__call__" else f"{a[0]}.{a[1]}"
    if job.kind in (C.FUNCTION, C.METHOD):
        return a[0]
    if job.kind == C.NEW:
        return a[0]
    if job.kind == C.RUN:
        return f"remote.run({job.extra})"
    if job.kind == C.COLLECTIVE:
        return f"remote.{a[0]}"
    return job.kind


# --------------------------------------------------------------------- handlers
#: constructors that may take a block from the cache (then filled as NumPy would)
_CACHED_NEW = frozenset({"empty", "zeros", "ones", "full"})


def _handle_new(w: Worker, j: Job) -> None:
    name, fargs, fkwargs, device = j.args
    if device < 0 and name in _CACHED_NEW:
        shape, dtype = j.meta[0]  # the master's own prediction: the shape and dtype asked for
        arr = w.cache.empty(shape, dtype, zero=name == "zeros")
        if name == "ones":
            np.copyto(arr, 1, casting="unsafe")  # what np.ones does after np.empty
        elif name == "full":
            np.copyto(arr, fargs[1], casting="unsafe")  # what np.full does after np.empty
        w.store(j, arr, device)
        return
    xp, ctx = _xp(device)
    with ctx:
        w.store(j, getattr(xp, name)(*fargs, **fkwargs), device)


def _handle_put(w: Worker, j: Job) -> None:
    shape, dtype, device, data, tag, posted = j.args
    arr: Any
    if data is not None:
        arr = np.frombuffer(data, dtype).reshape(shape).copy()
    elif posted:  # _prepare_put posted the receive and answered READY
        if isinstance(j.extra, BaseException):
            raise j.extra
        arr, work = j.extra
        if work is None:
            raise arr  # the allocation failed; the master was told NOT_READY and sent nothing
        work.wait()
    else:
        arr = w.recv_array(0, tag, shape, np.dtype(dtype))
        if isinstance(arr, list):
            raise ProcGroupError("the master failed to send the data")
    if device >= 0:
        cp = _cupy()
        with cp.cuda.Device(device):
            arr = cp.asarray(arr)
    j.outs[0].value = arr


def _handle_ufunc(w: Worker, j: Job) -> None:
    name, method, inputs, kwargs, device = j.args
    xp, ctx = _xp(device)
    with ctx:
        fn = getattr(xp, name)
        if method != "__call__":
            fn = getattr(fn, method)
        kw = w.values(kwargs, device)
        res = fn(*w.values(inputs, device), **kw)
    if j.outs:
        w.store(j, res, device)


def _handle_function(w: Worker, j: Job) -> None:
    name, fargs, fkwargs, device = j.args
    xp, ctx = _xp(device)
    with ctx:
        res = getattr(xp, name)(*w.values(fargs, device), **w.values(fkwargs, device))
    if j.outs:
        w.store(j, res, device)


def _handle_method(w: Worker, j: Job) -> None:
    name, obj, margs, mkwargs, device = j.args
    _, ctx = _xp(device)
    with ctx:
        res = getattr(obj.value, name)(*w.values(margs, device), **w.values(mkwargs, device))
    if j.outs:
        w.store(j, res, device)


def _handle_get_item(w: Worker, j: Job) -> None:
    obj, key, device = j.args
    _, ctx = _xp(device)
    with ctx:
        w.store(j, obj.value[w.values(key, device)], device)


def _handle_set_item(w: Worker, j: Job) -> None:
    obj, key, value, device = j.args
    _, ctx = _xp(device)
    with ctx:
        obj.value[w.values(key, device)] = w.values(value, device)


def _handle_get_array(w: Worker, j: Job) -> None:
    obj, tag, posted = j.args
    if obj.error is not None:
        w.reply_error(tag, [obj.error])
        return
    try:
        host = _host(obj.value)
    except BaseException as exc:  # noqa: BLE001 - the master is waiting for this reply
        w.reply_error(tag, [w.record_error(j, exc, "get")])
        return
    if posted:
        P.send_posted(w.channel, w.buf(), 0, tag, P.byte_view(host)).wait()
    else:
        w.send_array(0, tag, host)


def _handle_get_value(w: Worker, j: Job) -> None:
    obj, tag = j.args
    if obj.error is not None:
        w.reply_error(tag, [obj.error])
        return
    w.reply(tag, obj.value)


def _handle_send_to(w: Worker, j: Job) -> None:
    obj, dst, tag, posted = j.args
    buf = w.buf()
    if posted:  # the receiver says whether it posted its receive
        early = j.extra
        if isinstance(early, BaseException):
            raise early
        if early is None:
            w.channel.recv(buf[:1], dst, tag)
            ready = buf[0]
        else:  # the dispatcher took the READY, or is having it taken (_prepare_send_to)
            ready_work, ready_buf, data_work = early
            if data_work is not None:
                data_work.wait()  # the dispatcher sent it all: the receiver is copying
                return
            ready_work.wait()
            ready = ready_buf[0]
        if ready != P.READY:  # it could not allocate the result: no data, only why not
            if obj.error is not None:
                w.send_errors(dst, tag, [obj.error])
            else:
                P.send_payload(w.channel, buf, dst, tag, P.FrameKind.VALUE, b"")
            return
    errors = [obj.error] if obj.error is not None else None
    if errors is None:
        try:
            host = _host(obj.value)
        except BaseException as exc:  # noqa: BLE001 - the receiver is waiting for this frame
            errors = [w.record_error(j, exc, "to")]
    if errors is not None:
        w.send_errors(dst, tag, errors)
    elif posted:
        P.send_posted(w.channel, buf, dst, tag, P.byte_view(host)).wait()
    else:
        w.send_array(dst, tag, host)


def _handle_recv_from(w: Worker, j: Job) -> None:
    shape, dtype, device, src, tag, posted = j.args
    if posted:
        buf = w.buf()
        if isinstance(j.extra, BaseException):
            raise j.extra
        out, work = j.extra if j.extra is not None else _post_receive(w, shape, dtype, src, tag, buf)
        if work is None:  # we could not allocate: the source array's own failure says more
            kind, payload = P.recv_payload(w.channel, buf, src, tag)
            if kind != P.FrameKind.ERRORS:
                raise out
            j.outs[0].error = ErrorInfo(*pickle.loads(payload)[0])
            return
        got = recv_posted(w.channel, buf, src, tag, out, work)
    else:
        got = w.recv_array(src, tag, tuple(shape), np.dtype(dtype))
    if isinstance(got, list):
        j.outs[0].error = got[0]  # the source array had failed: pass its error on
        return
    if device >= 0:
        cp = _cupy()
        with cp.cuda.Device(device):
            got = cp.asarray(got)
    j.outs[0].value = got


def _post_receive(w: Worker, shape: Any, dtype: Any, src: int, tag: int, buf: np.ndarray) -> tuple[Any, Any]:
    """Allocate the result, post its receive and send READY (or NOT_READY): (the array,
    the receive's Work), or (the allocation's error, None)."""
    try:
        out = w.cache.empty(tuple(shape), np.dtype(dtype))
    except Exception as exc:  # noqa: BLE001 - MemoryError, a bad shape: raised by the job
        buf[0] = P.NOT_READY
        w.channel.send(buf[:1], src, tag)
        return exc, None
    work = post_array(w.channel, src, tag, out)
    buf[0] = P.READY
    try:
        w.channel.send(buf[:1], src, tag)
    except BaseException:
        work.cancel()
        raise
    return out, work


def _handle_to_device(w: Worker, j: Job) -> None:
    obj, device = j.args
    if device < 0:
        j.outs[0].value = _host(obj.value).copy() if isinstance(obj.value, np.ndarray) else _host(obj.value)
    else:
        cp = _cupy()
        with cp.cuda.Device(device):
            j.outs[0].value = cp.array(obj.value, copy=True)


def _handle_run(w: Worker, j: Job) -> None:
    fn_bytes, fargs, fkwargs, tag = j.args
    try:
        fn = pickle.loads(fn_bytes)
        j.extra = getattr(fn, "__qualname__", repr(fn))
        res = fn(*w.values(fargs, -1), **w.values(fkwargs, -1))
    except BaseException as exc:  # noqa: BLE001 - the user's function failed: the master raises it
        info = w.record_error(j, exc, _op_name(j))
        j.outs[0].error = info
        if tag is not None:
            w.reply_error(tag, [info])
        return
    j.outs[0].value = res
    if tag is None:  # run_async: the master asks for the value later
        return
    if isinstance(res, np.ndarray):
        meta: tuple[Any, ...] = ("array", res.shape, res.dtype.str, -1)
    elif type(res).__module__.startswith("cupy") and hasattr(res, "device"):
        meta = ("array", res.shape, res.dtype.str, int(res.device.id))
    else:
        meta = ("value",)
    w.reply(tag, meta)


def _handle_collective(w: Worker, j: Job) -> None:
    what, ranks, obj, arg, shape, dtype = j.args
    seq = j.extra
    group = w.groups[ranks]
    with w.group_cv:  # every worker runs a group's collectives in the master's order
        if not w.group_cv.wait_for(lambda: w.group_done.get(ranks, 0) == seq, w.timeout):
            raise CommTimeoutError(f"remote.{what}: an earlier collective of nodes {ranks} did not finish")
    try:
        value = obj.value
        if obj.error is not None:  # still take part, so the other nodes are not left waiting
            _ops.all_reduce(np.zeros(shape, dtype), ReduceOp(arg), group=group) if what == "all_reduce" \
                else _ops.broadcast(np.zeros(shape, dtype), arg, group=group)
            return
        contiguous = getattr(value, "flags", None) is not None and value.flags.c_contiguous
        buf = value if contiguous else value.copy()
        if what == "all_reduce":
            _ops.all_reduce(buf, ReduceOp(arg), group=group)
        else:
            _ops.broadcast(buf, arg, group=group)
        if not contiguous:
            value[...] = buf
    finally:
        with w.group_cv:
            w.group_done[ranks] = seq + 1
            w.group_cv.notify_all()


def _handle_record_event(w: Worker, j: Job) -> None:
    ev: WorkerEvent = j.extra
    ev.t = time.perf_counter()
    ev.flag.set()


def _handle_wait_event(w: Worker, j: Job) -> None:
    ev: WorkerEvent | None = j.extra
    if ev is not None and not ev.flag.wait(w.timeout):
        raise CommTimeoutError(f"Event.wait: the event was not reached within {w.timeout}s")


def _handle_stream_mark(w: Worker, j: Job) -> None:
    j.extra()


def _handle_stream_synchronize(w: Worker, j: Job) -> None:
    (tag,) = j.args
    errors = w.take_errors(j.stream)
    if errors:
        w.reply_error(tag, errors)
    else:
        w.reply(tag, None)


_HANDLERS: dict[str, Callable[[Worker, Job], None]] = {
    C.NEW: _handle_new, C.PUT: _handle_put, C.UFUNC: _handle_ufunc, C.FUNCTION: _handle_function, C.METHOD: _handle_method,
    C.GET_ITEM: _handle_get_item, C.SET_ITEM: _handle_set_item, C.GET_ARRAY: _handle_get_array, C.GET_VALUE: _handle_get_value, C.SEND_TO: _handle_send_to,
    C.RECV_FROM: _handle_recv_from, C.TO_DEVICE: _handle_to_device, C.RUN: _handle_run, C.COLLECTIVE: _handle_collective,
    C.RECORD_EVENT: _handle_record_event, C.WAIT_EVENT: _handle_wait_event, C.STREAM_MARK: _handle_stream_mark, C.STREAM_SYNCHRONIZE: _handle_stream_synchronize,
}
#: kinds that see their inputs' errors themselves (they must answer someone)
_HANDLES_ERRORS = frozenset({C.GET_ARRAY, C.GET_VALUE, C.SEND_TO, C.COLLECTIVE, C.STREAM_SYNCHRONIZE, C.STREAM_MARK, C.RECORD_EVENT, C.WAIT_EVENT, C.RUN})


def _prepare_recv_from(w: Worker, j: Job) -> None:
    """A posted copy's receiver posts and answers READY at dispatch, not when its stream
    gets there: the result is a fresh array no earlier op touches, and the sender need
    not wait for this worker's thread hand-off."""
    shape, dtype, _, src, tag, posted = j.args
    if posted:
        try:
            j.extra = _post_receive(w, shape, dtype, src, tag, w.main_buf)
        except Exception as exc:  # noqa: BLE001 - the job raises it on its stream
            j.extra = exc


def _prepare_put(w: Worker, j: Job) -> None:
    """A large remote.send: the master waits for READY before its data moves, straight
    into the result (never into the transport's unexpected-message buffer)."""
    shape, dtype, _, _, tag, posted = j.args
    if posted:
        try:
            j.extra = _post_receive(w, shape, dtype, 0, tag, w.main_buf)
        except Exception as exc:  # noqa: BLE001 - the job raises it on its stream
            j.extra = exc


def _prepare_send_to(w: Worker, j: Job) -> None:
    """A posted copy's sender listens for READY at dispatch; when its stream is idle, its
    array computed and READY already here, it sends right away (the stream's job then only
    waits for the copy to finish), saving the thread hand-off on the copy's critical path."""
    obj, dst, tag, posted = j.args
    if posted:
        try:
            _start_send_to(w, j, obj, dst, tag)
        except Exception as exc:  # noqa: BLE001 - the job raises it on its stream
            j.extra = exc


def _start_send_to(w: Worker, j: Job, obj: Slot, dst: int, tag: int) -> None:
    ready = np.empty(1, np.uint8)
    ready_work = w.channel.irecv(ready, dst, tag)
    j.extra = (ready_work, ready, None)
    st = w.streams.get(j.stream)
    if (st is not None and not st.idle) or not obj.ready.is_set() or obj.error is not None \
            or type(obj.value) is not np.ndarray or not obj.value.flags.c_contiguous \
            or not ready_work.is_completed():
        return  # the stream's job does the rest (no copy, no waiting on this thread)
    ready_work.wait()
    if ready[0] != P.READY:
        return
    j.extra = (ready_work, ready, P.send_posted(w.channel, w.main_buf, dst, tag, P.byte_view(obj.value)))


def _prepare_record_event(w: Worker, j: Job) -> None:
    ev = WorkerEvent()
    w.events[j.args[0]] = ev
    j.extra = ev


def _prepare_wait_event(w: Worker, j: Job) -> None:
    j.extra = w.events.get(j.args[0])


def _prepare_collective(w: Worker, j: Job) -> None:
    ranks = j.args[1]
    seq = w.group_issued.get(ranks, 0)
    w.group_issued[ranks] = seq + 1
    j.extra = seq


def _prepare_run(w: Worker, j: Job) -> None:
    j.extra = "fn"


_PREPARE: dict[str, Callable[[Worker, Job], None]] = {
    C.RECORD_EVENT: _prepare_record_event, C.WAIT_EVENT: _prepare_wait_event, C.COLLECTIVE: _prepare_collective, C.RUN: _prepare_run,
    C.RECV_FROM: _prepare_recv_from, C.SEND_TO: _prepare_send_to, C.PUT: _prepare_put,
}


# --------------------------------------------------------------------- main-thread commands
def _handle_free(w: Worker, ids: tuple[int, ...]) -> None:
    for i in ids:
        w.slots.pop(i, None)
        w.events.pop(i, None)
    w.cache.collect()  # file the blocks these frees released now, so the limit holds now


def _handle_new_group(w: Worker, ranks: tuple[int, ...]) -> None:
    g = _lifecycle.new_group(list(ranks))
    if w.rank in ranks:
        w.groups[tuple(ranks)] = g


def _when_drained(w: Worker, then: Callable[[], None]) -> None:
    """Run ``then`` once every stream has run what was dispatched before now: at once when
    all are idle; on the stream itself when one is busy (no thread to start and wake on the
    way to the reply, e.g. the synchronize after a ``.to()``); else on a waiter thread."""
    busy = [st for st in w.streams.values() if not st.idle]
    if not busy:
        then()
        return
    if len(busy) == 1:
        busy[0].submit(Job(C.STREAM_MARK, busy[0].sid, [], (), [], [], None, then))
        return
    marks = []
    for st in busy:
        ev = threading.Event()
        marks.append(ev)
        st.submit(Job(C.STREAM_MARK, st.sid, [], (), [], [], None, ev.set))

    def waiter() -> None:
        deadline = time.monotonic() + w.timeout
        for ev in marks:
            ev.wait(max(0.0, deadline - time.monotonic()))
        then()

    threading.Thread(target=waiter, name="procgroup-node-sync", daemon=True).start()


def _handle_synchronize(w: Worker, tag: int) -> None:
    def then() -> None:
        errors = w.take_errors()
        if errors:
            w.reply_error(tag, errors)
        else:
            w.reply(tag, None)

    _when_drained(w, then)


def _handle_memory_info(w: Worker, tag: int) -> None:
    def then() -> None:
        seen: dict[int, int] = {}
        arrays = 0
        for slot in list(w.slots.values()):
            v = slot.value
            nbytes = getattr(v, "nbytes", None)
            if nbytes is None or not hasattr(v, "shape"):
                continue
            arrays += 1
            base = v
            while getattr(base, "base", None) is not None and hasattr(base.base, "nbytes"):
                base = base.base
            seen[id(base)] = int(base.nbytes)
        w.reply(tag, {"arrays": arrays, "bytes": sum(seen.values()), "cached_bytes": w.cache.cached_bytes()})

    _when_drained(w, then)


def _handle_empty_cache(w: Worker, tag: int) -> None:
    def then() -> None:
        w.cache.release()
        w.reply(tag, None)

    _when_drained(w, then)


def _handle_stream_query(w: Worker, sid: int, tag: int) -> None:
    st = w.streams.get(sid)
    w.reply(tag, st is None or st.idle)


def _handle_event_query(w: Worker, eid: int, tag: int) -> None:
    ev = w.events.get(eid)
    w.reply(tag, ev is None or ev.flag.is_set())


def _handle_event_synchronize(w: Worker, eids: tuple[int, ...], tag: int) -> None:
    evs = [w.events.get(e) for e in eids]

    def waiter() -> None:
        deadline = time.monotonic() + w.timeout
        for ev in evs:
            if ev is not None and not ev.flag.wait(max(0.0, deadline - time.monotonic())):
                w.reply_error(tag, [ErrorInfo(w.node, w.rank, "Event.synchronize", "CommTimeoutError",
                                              f"the event was not reached within {w.timeout}s", "")])
                return
        if len(evs) == 2:
            if evs[0] is None or evs[1] is None:
                w.reply_error(tag, [ErrorInfo(w.node, w.rank, "Event.elapsed_time", "RuntimeError",
                                              "both events must be recorded before elapsed_time()", "")])
                return
            w.reply(tag, (evs[1].t - evs[0].t) * 1000.0)
        else:
            w.reply(tag, None)

    if all(ev is None or ev.flag.is_set() for ev in evs):
        waiter()
    else:
        threading.Thread(target=waiter, name="procgroup-event-sync", daemon=True).start()


def _handle_goodbye(w: Worker, tag: int) -> bool:
    for st in w.streams.values():
        st.q.put(None)
    deadline = time.monotonic() + 5.0
    for st in w.streams.values():
        st.thread.join(max(0.0, deadline - time.monotonic()))
    try:
        w.reply(tag, None)
        # every rank leaves together, as after any program's last barrier: some transports
        # (MPI) free their communicators collectively
        _ops.barrier()
    except Exception:  # noqa: BLE001 - the job is ending: a peer gone by now changes nothing
        pass
    return False


_MAIN: dict[str, Callable[..., Any]] = {
    C.FREE: _handle_free, C.NEW_GROUP: _handle_new_group, C.SYNCHRONIZE: _handle_synchronize, C.MEMORY_INFO: _handle_memory_info, C.EMPTY_CACHE: _handle_empty_cache,
    C.STREAM_QUERY: _handle_stream_query, C.EVENT_QUERY: _handle_event_query, C.EVENT_SYNCHRONIZE: _handle_event_synchronize, C.GOODBYE: _handle_goodbye,
}


def hello(node: int) -> dict[str, Any]:
    """What the master learns about this worker at init."""
    info: dict[str, Any] = {"node": node, "host": socket.gethostname(), "pid": os.getpid(), "gpus": 0,
                            "cupy": None, "cupy_error": None}
    try:
        import cupy

        info["cupy"] = cupy.__version__
        info["gpus"] = int(cupy.cuda.runtime.getDeviceCount())
    except ImportError as exc:
        info["cupy_error"] = f"cupy is not installed ({exc})"
    except Exception as exc:  # noqa: BLE001 - no driver, no device
        info["cupy_error"] = f"{type(exc).__name__}: {exc}"
    return info


def serve_forever(node: int, rank: int, timeout: float, workers_group: Any) -> int:
    """The worker's life after init: say hello, serve, return the exit status.

    A bad setting is reported in the hello (the master raises it at init, naming this
    node); the worker then serves with the cache off until the master ends the job."""
    info = hello(node)
    try:
        limit = cache_limit()
    except InvalidArgumentError as exc:
        limit, info["setting_error"] = 0, str(exc)
    w = Worker(node, rank, timeout, workers_group, limit)
    P.send_payload(w.channel, w.buf(), 0, P.HELLO_TAG, P.FrameKind.VALUE, P.dumps(info))
    return w.serve()


__all__ = ["Worker", "post_array", "recv_array", "recv_posted", "serve_forever"]
