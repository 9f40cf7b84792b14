"""NcclChannel: procgroup's DataChannel over NCCL communicators, through CuPy.

One communicator per group and process, made lazily by the first op (on the GPU of
that op's arrays) and cached; ``_clear_group_cache`` drops it. Every op runs on a
procgroup stream per GPU that first waits (event) on the caller's stream, and hands its
result back the same way, so the host is not blocked (torch's NCCL semantics); barrier
and blocking-wait mode (``PROCGROUP_NCCL_BLOCKING_WAIT=1``) also wait on the host, with
the group timeout. all_to_all, gather and scatter are grouped send/recv
(ncclGroupStart/End). NCCL matches point-to-point messages by peer and order: tags are
not used, and recv needs ``src``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from procgroup.backend import ChannelContext, DataChannel, Lowered, env_flag
from procgroup.errors import (
    CommTimeoutError,
    GroupRevokedError,
    InvalidArgumentError,
    InvalidArrayError,
    PeerError,
    ProcGroupError,
    UnsupportedOperationError,
)
from procgroup.ops import ReduceOp

from . import _comm
from ._buffers import (
    DeviceBuffer,
    adjacent,
    check_distinct_devices,
    device_buffer,
    same_device,
)
from ._streams import caller_stream
from ._types import BYTE_TYPE, reduce_plan, reduce_table, resolve
from ._work import Inflight, NcclWork, Watchdog

log = logging.getLogger(__name__)

#: ncclResult_t values that mean "the call was wrong", not "the communicator is broken".
_USAGE_ERRORS = {4, 5}  # ncclInvalidArgument, ncclInvalidUsage
_CLOSE_WAIT = 30.0  # seconds close() lets in-flight ops finish before aborting

Body = Callable[[Any, Any], Sequence[Any] | None]


#: Blocking-wait mode: every wait blocks the host until the op is done (or times out).
ENV_BLOCKING_WAIT = "PROCGROUP_NCCL_BLOCKING_WAIT"


def blocking_wait(options: Mapping[str, Any] | None) -> bool:
    """Blocking-wait mode: ctx.options["blocking_wait"], else $PROCGROUP_NCCL_BLOCKING_WAIT."""
    return env_flag(ENV_BLOCKING_WAIT, False, name="blocking_wait", options=options or {})


class NcclChannel(DataChannel):
    """A group's NCCL communicator(s), streams and watchdog."""

    backend_name = "nccl"
    devices = ("cuda",)

    def __init__(self, ctx: ChannelContext) -> None:
        super().__init__(ctx)
        import cupy
        from cupy.cuda import nccl

        self._cupy = cupy
        self._nccl = nccl
        self._lock = threading.RLock()
        self._comm: Any = None
        self._comm_device: int | None = None
        self._multi: dict[tuple[int, ...], list[Any]] = {}
        self._generation = 0
        self._multi_seq = 0
        self._streams: dict[int, Any] = {}
        self._barrier_bufs: dict[int, Any] = {}
        self._table = reduce_table(int(nccl.get_version()))
        self._aborted = False
        self._blocking_wait = blocking_wait(ctx.options)
        self._watchdog = Watchdog(f"procgroup-nccl-watchdog-g{ctx.group_id}", self._abort, self._async_error)
        self._side = self._open_control_plane(ctx)

    # ----------------------------------------------------------------- surviving a death
    # NCCL cannot tell a dead peer from a slow one (an op on a dead peer hangs), so each
    # group keeps a host side channel (tcp: sockets see an exit at once, heartbeats a
    # hang) as its control plane: a death there aborts the communicators (ops blocked in
    # NCCL are released), and shrink builds a new NcclChannel, whose communicator the
    # first op creates through the survivors' new Store (docs/fault-tolerance.md).
    def _open_control_plane(self, ctx: ChannelContext) -> DataChannel | None:
        """The side channel carrying revoke/agree and death notices; option
        ``control_plane=False`` (or one rank) opens none (no survival then)."""
        wanted = ctx.options.get("control_plane", True)
        if ctx.size == 1 or ctx.open_side_channel is None or wanted in (False, 0, "0", "false", "off"):
            return None
        side = ctx.open_side_channel(dataclasses.replace(ctx, options={**ctx.options, "arena": False}))
        side.carry_control(self, {r: r for r in range(ctx.size)})
        return side

    @property
    def survives(self) -> bool:
        return self._side is not None

    @property
    def control_id(self) -> int:
        return -1 - self.ctx.group_id  # apart from the side channel's own group id

    def do_control_send(self, dst: int, payload: bytes) -> None:
        if self._side is None:
            super().do_control_send(dst, payload)
        else:
            self._side.do_control_send(dst, payload)

    def interrupt(self, exc: BaseException) -> bool:
        """Abort the communicators: every op blocked in NCCL, here, fails now."""
        first = self.failure is None
        self._abort(exc)
        return first

    # ----------------------------------------------------------------- communicators
    def _communicator(self, device: int) -> Any:
        """The group's communicator, created on ``device`` by the first op (collective)."""
        if self._comm is None:
            key = f"comm/{self._generation}"
            self._comm = _comm.create_communicator(
                self.ctx.store, key, self.rank, self.size, device, self.timeout
            )
            self._comm_device = device
        elif device != self._comm_device:
            raise InvalidArrayError(
                f"backend 'nccl': this group's communicator is on cuda:{self._comm_device} but the "
                f"array is on cuda:{device}; use one GPU per process and group (or *_multigpu)"
            )
        return self._comm

    def _multi_communicators(self, devices: tuple[int, ...]) -> list[Any]:
        comms = self._multi.get(devices)
        if comms is None:
            key = f"multi/{self._generation}/{self._multi_seq}"
            self._multi_seq += 1
            comms = _comm.create_multi_communicators(
                self.ctx.store, key, self.rank, self.size, devices, self.timeout
            )
            self._multi[devices] = comms
        return comms

    def _all_comms(self) -> list[Any]:
        comms = [self._comm] if self._comm is not None else []
        for group in list(self._multi.values()):
            comms.extend(group)
        return comms

    def _stream(self, device: int) -> Any:
        stream = self._streams.get(device)
        if stream is None:
            with self._cupy.cuda.Device(device):
                stream = self._cupy.cuda.Stream(non_blocking=True)
            self._streams[device] = stream
        return stream

    # ----------------------------------------------------------------- failure handling
    def _abort(self, error: BaseException) -> None:
        """Break the channel: abort every communicator; pending and later ops fail with ``error``.

        Called by the watchdog thread without the channel lock, so an op blocked inside
        NCCL on another thread is released by the abort.
        """
        self.fail(error)
        self._watchdog.fail_all(error)
        if not self._aborted:
            self._aborted = True
            for comm in self._all_comms():
                _comm.close_communicator(comm, abort=True)

    def _async_error(self) -> BaseException | None:
        if self._aborted:
            return None  # aborted handles must not be touched again
        for comm in self._all_comms():
            try:
                comm.check_async_error()
            except self._nccl.NcclError as exc:
                return PeerError(f"NCCL reported an asynchronous error ({exc}); the communicator was aborted")
        return None

    def _nccl_error(self, op: str, exc: BaseException) -> ProcGroupError:
        status = getattr(exc, "status", None)
        if status in _USAGE_ERRORS:
            return InvalidArgumentError(f"{op}: NCCL rejected the call ({exc})")
        err = PeerError(f"{op}: NCCL failed ({exc}); the communicator was aborted")
        self._abort(err)
        return err

    def _check_usable(self, op: str) -> None:
        """check_usable(), saying that the communicator was aborted and what to do."""
        broken = self.failure
        if broken is None or self._closed or isinstance(broken, GroupRevokedError):
            self.check_usable()
            return
        msg = (f"{op}: the nccl communicator was aborted after an earlier error ({broken}); "
               f"destroy this group and create a new one")
        if isinstance(broken, CommTimeoutError):
            raise CommTimeoutError(msg, op=op)
        raise PeerError(msg)

    # ----------------------------------------------------------------- launching
    def _work(self, inflight: Inflight, host: bool = False) -> NcclWork:
        self._watchdog.track(inflight)
        return NcclWork(inflight, self._abort, self.timeout, host_sync=host, blocking=self._blocking_wait)

    def _launch(self, op: str, device: int, body: Body, keep: tuple[Any, ...], result: Any = None,
                host: bool = False) -> NcclWork:
        """Enqueue ``body(comm, stream)`` on the procgroup stream after the caller's work."""
        cuda = self._cupy.cuda
        with self._lock:
            self._check_usable(op)
            comm = self._communicator(device)
            with cuda.Device(device):
                stream = self._stream(device)
                ready = cuda.Event(disable_timing=True)
                ready.record(caller_stream())
                stream.wait_event(ready)
                try:
                    extra = body(comm, stream) or ()
                except self._nccl.NcclError as exc:
                    raise self._nccl_error(op, exc) from exc
                done = cuda.Event(disable_timing=True)
                done.record(stream)
            inflight = Inflight(op, [(device, done)], (*keep, *extra), time.monotonic() + self.timeout, result)
            return self._work(inflight, host)

    def _launch_multi(self, op: str, buffers: Sequence[DeviceBuffer],
                      inside: Callable[[int, Any, Any], None],
                      before: Callable[[int, Any], Sequence[Any]] | None = None,
                      after: Callable[[int, Any], None] | None = None) -> NcclWork:
        """One op over several GPUs of this process: a grouped NCCL call per device.

        ``before``/``after`` run per device outside the NCCL group (allocations, copies):
        NCCL enqueues grouped calls only at groupEnd, so stream work must not sit inside.
        """
        cuda = self._cupy.cuda
        devices = check_distinct_devices(buffers, op)
        with self._lock:
            self._check_usable(op)
            comms = self._multi_communicators(devices)
            streams, keep = [], [b.owner for b in buffers]
            for i, dev in enumerate(devices):
                with cuda.Device(dev):
                    stream = self._stream(dev)
                    ready = cuda.Event(disable_timing=True)
                    ready.record(caller_stream())
                    stream.wait_event(ready)
                    streams.append(stream)
                    if before is not None:
                        keep.extend(before(i, stream))
            try:
                self._nccl.groupStart()
                try:
                    for i, dev in enumerate(devices):
                        with cuda.Device(dev):
                            inside(i, comms[i], streams[i])
                finally:
                    self._nccl.groupEnd()
            except self._nccl.NcclError as exc:
                raise self._nccl_error(op, exc) from exc
            events = []
            for i, dev in enumerate(devices):
                with cuda.Device(dev):
                    if after is not None:
                        after(i, streams[i])
                    done = cuda.Event(disable_timing=True)
                    done.record(streams[i])
                    events.append((dev, done))
            return self._work(Inflight(op, events, tuple(keep), time.monotonic() + self.timeout))

    # ----------------------------------------------------------------- helpers
    def _plan(self, dtype: Any, op: ReduceOp, collective: str) -> Lowered:
        return reduce_plan(dtype, op, collective=collective, table=self._table)

    def _copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes and dst != src:
            rt = self._cupy.cuda.runtime
            rt.memcpyAsync(dst, src, nbytes, rt.memcpyDeviceToDevice, stream.ptr)

    def _scratch(self, nbytes: int, stream: Any) -> Any:
        """Device bytes allocated in ``stream``'s order (CuPy's pool is stream-aware)."""
        with stream:
            return self._cupy.empty(max(nbytes, 1), dtype=self._cupy.uint8)

    def _divide(self, buf: DeviceBuffer, count: int, stream: Any) -> None:
        """AVG without ncclAvg (NCCL < 2.10): divide the SUM by the rank count."""
        cp = self._cupy
        mem = cp.cuda.UnownedMemory(buf.ptr, buf.nbytes, buf.owner, buf.device)
        view = cp.ndarray((buf.size,), buf.dtype, cp.cuda.MemoryPointer(mem, 0))
        with stream:
            view /= count

    def _group(self, calls: Callable[[], None]) -> None:
        self._nccl.groupStart()
        try:
            calls()
        finally:
            self._nccl.groupEnd()

    # ----------------------------------------------------------------- the ops
    # Each op is one start_<op>; a blocking call is start + NcclWork.wait(): the caller's
    # stream waits for the op, the host only for barrier, blocking-wait mode or a timeout.
    def start_broadcast(self, array: Any, src: int) -> NcclWork:
        buf = device_buffer(array)
        byte = resolve(BYTE_TYPE)
        return self._launch("broadcast", buf.device,
                            lambda c, s: c.bcast(buf.ptr, buf.nbytes, byte, src, s.ptr), (buf.owner,))

    def start_all_reduce(self, array: Any, op: ReduceOp) -> NcclWork:
        buf = device_buffer(array)
        plan = self._plan(buf.dtype, op, "all_reduce")

        def body(c: Any, s: Any) -> None:
            c.allReduce(buf.ptr, buf.ptr, buf.size * plan.factor, plan.dtype, plan.op, s.ptr)
            if plan.divide:
                self._divide(buf, self.size, s)

        return self._launch("all_reduce", buf.device, body, (buf.owner,))

    def start_reduce(self, array: Any, dst: int, op: ReduceOp) -> NcclWork:
        buf = device_buffer(array)
        plan = self._plan(buf.dtype, op, "reduce")

        def body(c: Any, s: Any) -> None:
            c.reduce(buf.ptr, buf.ptr, buf.size * plan.factor, plan.dtype, plan.op, dst, s.ptr)
            if plan.divide and self.rank == dst:
                self._divide(buf, self.size, s)

        return self._launch("reduce", buf.device, body, (buf.owner,))

    def start_all_gather(self, output_list: Sequence[Any], array: Any) -> NcclWork:
        inp = device_buffer(array, "array")
        outs = [device_buffer(a, f"output_list[{i}]") for i, a in enumerate(output_list)]
        device = same_device([inp, *outs], "all_gather")
        n, byte = inp.nbytes, resolve(BYTE_TYPE)

        def body(c: Any, s: Any) -> Sequence[Any]:
            if adjacent(outs):
                c.allGather(inp.ptr, outs[0].ptr, n, byte, s.ptr)
                return ()
            tmp = self._scratch(n * self.size, s)
            c.allGather(inp.ptr, tmp.data.ptr, n, byte, s.ptr)
            for i, o in enumerate(outs):
                self._copy(o.ptr, tmp.data.ptr + i * n, n, s)
            return (tmp,)

        return self._launch("all_gather", device, body, (inp.owner, *[o.owner for o in outs]))

    def start_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> NcclWork:
        out = device_buffer(output, "output")
        ins = [device_buffer(a, f"input_list[{i}]") for i, a in enumerate(input_list)]
        device = same_device([out, *ins], "reduce_scatter")
        plan = self._plan(out.dtype, op, "reduce_scatter")
        n = out.nbytes

        def body(c: Any, s: Any) -> Sequence[Any]:
            extra: tuple[Any, ...] = ()
            if adjacent(ins):
                src = ins[0].ptr
            else:
                tmp = self._scratch(n * self.size, s)
                for i, b in enumerate(ins):
                    self._copy(tmp.data.ptr + i * n, b.ptr, n, s)
                src, extra = tmp.data.ptr, (tmp,)
            c.reduceScatter(src, out.ptr, out.size * plan.factor, plan.dtype, plan.op, s.ptr)
            if plan.divide:
                self._divide(out, self.size, s)
            return extra

        return self._launch("reduce_scatter", device, body, (out.owner, *[b.owner for b in ins]))

    def start_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> NcclWork:
        inp = device_buffer(array, "array")
        outs = [device_buffer(a, f"gather_list[{i}]") for i, a in enumerate(gather_list or ())]
        device = same_device([inp, *outs], "gather")
        n, byte = inp.nbytes, resolve(BYTE_TYPE)

        def body(c: Any, s: Any) -> None:
            if self.rank == dst:
                self._copy(outs[dst].ptr, inp.ptr, n, s)

            def calls() -> None:
                if self.rank == dst:
                    for j, o in enumerate(outs):
                        if j != dst:
                            c.recv(o.ptr, n, byte, j, s.ptr)
                else:
                    c.send(inp.ptr, n, byte, dst, s.ptr)

            self._group(calls)

        return self._launch("gather", device, body, (inp.owner, *[o.owner for o in outs]))

    def start_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> NcclWork:
        out = device_buffer(array, "array")
        ins = [device_buffer(a, f"scatter_list[{i}]") for i, a in enumerate(scatter_list or ())]
        device = same_device([out, *ins], "scatter")
        n, byte = out.nbytes, resolve(BYTE_TYPE)

        def body(c: Any, s: Any) -> None:
            if self.rank == src:
                self._copy(out.ptr, ins[src].ptr, n, s)

            def calls() -> None:
                if self.rank == src:
                    for j, b in enumerate(ins):
                        if j != src:
                            c.send(b.ptr, n, byte, j, s.ptr)
                else:
                    c.recv(out.ptr, n, byte, src, s.ptr)

            self._group(calls)

        return self._launch("scatter", device, body, (out.owner, *[b.owner for b in ins]))

    def start_all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> NcclWork:
        outs = [device_buffer(a, f"output_list[{i}]") for i, a in enumerate(output_list)]
        ins = [device_buffer(a, f"input_list[{i}]") for i, a in enumerate(input_list)]
        device = same_device([*outs, *ins], "all_to_all")
        n, byte, me = ins[0].nbytes, resolve(BYTE_TYPE), self.rank

        def body(c: Any, s: Any) -> None:
            self._copy(outs[me].ptr, ins[me].ptr, n, s)

            def calls() -> None:
                for j in range(self.size):
                    if j != me:
                        c.send(ins[j].ptr, n, byte, j, s.ptr)
                        c.recv(outs[j].ptr, n, byte, j, s.ptr)

            self._group(calls)

        return self._launch("all_to_all", device, body, (*[o.owner for o in outs], *[b.owner for b in ins]))

    def start_barrier(self) -> NcclWork:
        """A one-float all_reduce whose wait() blocks the host (not only the stream)."""
        cuda = self._cupy.cuda
        device = self._comm_device if self._comm_device is not None else int(cuda.Device().id)
        buf = self._barrier_bufs.get(device)
        if buf is None:
            with cuda.Device(device):
                buf = self._cupy.empty(1, dtype=self._cupy.float32)
            self._barrier_bufs[device] = buf
        t, o = resolve("FLOAT32"), resolve("SUM")
        return self._launch("barrier", device, lambda c, s: c.allReduce(buf.data.ptr, buf.data.ptr, 1, t, o, s.ptr),
                            (), host=True)

    def start_send(self, array: Any, dst: int, tag: int = 0) -> NcclWork:
        """Enqueue the send; the caller's stream may reuse the buffer after it (tags unused)."""
        buf = device_buffer(array)
        byte = resolve(BYTE_TYPE)
        return self._launch("send", buf.device, lambda c, s: c.send(buf.ptr, buf.nbytes, byte, dst, s.ptr), (buf.owner,))

    def start_recv(self, array: Any, src: int | None = None, tag: int = 0) -> NcclWork:
        if src is None:
            raise UnsupportedOperationError(
                "recv: backend 'nccl' cannot receive from any source on cuda (NCCL matches "
                "messages by peer); pass src=..."
            )
        buf = device_buffer(array)
        byte = resolve(BYTE_TYPE)
        return self._launch("recv", buf.device, lambda c, s: c.recv(buf.ptr, buf.nbytes, byte, src, s.ptr),
                            (buf.owner,), result=src)

    # ----------------------------------------------------------------- failure scope
    # Each group has its own communicator and its own side channel (control plane), so a
    # death is seen only by the side channels of the groups that hold the dead rank, and
    # aborts only their communicators (``fail_peer``'s default: ``interrupt``). NCCL aborts
    # a communicator as a whole: point-to-point between live members of such a group
    # fails too. NCCL has no any-source receive; the acknowledgement is the side channel's.
    def failure_ack(self) -> None:
        if self._side is not None:
            self._side.failure_ack()  # type: ignore[attr-defined]  # a tcp channel: the registry's side channel

    def failure_get_acked(self) -> list[int]:
        return [] if self._side is None else list(self._side.failure_get_acked())  # type: ignore[attr-defined]  # as above

    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        """A native communicator of its own (its unique id goes through ctx's Store)."""
        return NcclChannel(ctx)

    # ----------------------------------------------------------------- multi-GPU
    def start_broadcast_multigpu(self, bufs: Sequence[DeviceBuffer], root: int) -> NcclWork:
        byte = resolve(BYTE_TYPE)
        return self._launch_multi("broadcast_multigpu", bufs,
                                  lambda i, c, s: c.bcast(bufs[i].ptr, bufs[i].nbytes, byte, root, s.ptr))

    def start_all_reduce_multigpu(self, bufs: Sequence[DeviceBuffer], op: ReduceOp) -> NcclWork:
        plan = self._plan(bufs[0].dtype, op, "all_reduce_multigpu")
        total = self.size * len(bufs)
        return self._launch_multi(
            "all_reduce_multigpu", bufs,
            lambda i, c, s: c.allReduce(bufs[i].ptr, bufs[i].ptr, bufs[i].size * plan.factor, plan.dtype,
                                        plan.op, s.ptr),
            after=(lambda i, s: self._divide(bufs[i], total, s)) if plan.divide else None,
        )

    def start_reduce_multigpu(self, bufs: Sequence[DeviceBuffer], root: int, op: ReduceOp) -> NcclWork:
        plan = self._plan(bufs[0].dtype, op, "reduce_multigpu")
        ndev = len(bufs)

        def after(i: int, s: Any) -> None:
            if plan.divide and self.rank * ndev + i == root:
                self._divide(bufs[i], self.size * ndev, s)

        return self._launch_multi(
            "reduce_multigpu", bufs,
            lambda i, c, s: c.reduce(bufs[i].ptr, bufs[i].ptr, bufs[i].size * plan.factor, plan.dtype, plan.op,
                                     root, s.ptr),
            after=after,
        )

    def start_all_gather_multigpu(self, out_lists: Sequence[Sequence[DeviceBuffer]],
                                  bufs: Sequence[DeviceBuffer]) -> NcclWork:
        byte, n = resolve(BYTE_TYPE), bufs[0].nbytes
        total = self.size * len(bufs)
        targets: list[int] = [0] * len(bufs)
        scratch: dict[int, Any] = {}

        def before(i: int, s: Any) -> Sequence[Any]:
            outs = out_lists[i]
            if adjacent(outs):
                targets[i] = outs[0].ptr
                return [o.owner for o in outs]
            scratch[i] = self._scratch(n * total, s)
            targets[i] = scratch[i].data.ptr
            return [scratch[i], *[o.owner for o in outs]]

        def after(i: int, s: Any) -> None:
            if i in scratch:
                for k, o in enumerate(out_lists[i]):
                    self._copy(o.ptr, targets[i] + k * n, n, s)

        return self._launch_multi(
            "all_gather_multigpu", bufs,
            lambda i, c, s: c.allGather(bufs[i].ptr, targets[i], n, byte, s.ptr),
            before=before, after=after,
        )

    # ----------------------------------------------------------------- teardown
    def _drain(self) -> bool:
        """Let in-flight ops finish (bounded); True when they all did."""
        return all(p.host_wait(min(self.timeout, _CLOSE_WAIT)) for p in self._watchdog.pending())

    def clear_cache(self) -> int:
        """Drop this group's communicators (all ranks call it, in the same order).

        A channel whose communicator was aborted is usable again afterwards: the next op
        makes a new communicator.
        """
        with self._lock:
            finished = self._drain()
            comms = self._all_comms()
            for comm in comms:
                if not self._aborted:
                    _comm.close_communicator(comm, abort=not finished)
            self._comm, self._comm_device, self._multi = None, None, {}
            self._generation += 1
            self._multi_seq = 0
            if self._aborted:
                self._aborted = False
                self.clear_failure()  # the new communicator heals it
            return len(comms)

    def do_close(self) -> None:
        """Destroy the communicators once in-flight ops finish, else abort them."""
        finished = self._drain()
        self._watchdog.stop()
        if not self._aborted:
            self._aborted = True
            for comm in self._all_comms():
                _comm.close_communicator(comm, abort=not finished)
        self._watchdog.fail_all(PeerError("the nccl channel was closed"))
        if self._side is not None:
            self._side._children.pop(self.control_id, None)
            self._side.close()
        self._comm, self._multi = None, {}
        self._streams.clear()
        self._barrier_bufs.clear()


__all__ = ["ENV_BLOCKING_WAIT", "NcclChannel", "blocking_wait"]
