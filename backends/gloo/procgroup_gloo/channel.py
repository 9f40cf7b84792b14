"""GlooChannel: collectives through pygloo on the caller's memory, p2p on a TCP side channel.

Why two transports: pygloo holds the GIL for the whole of every gloo call, and gloo's
send blocks until the receiver has posted its recv (measured: a 16-byte send waits for
the receiver; a thread blocked in pygloo.recv stops every other thread of the process).
With p2p on gloo an ``irecv`` would freeze its own process, so the ``isend``/``recv``
pairs the API promises would deadlock; and gloo's recv needs an explicit peer. So
point-to-point (any-source, tags, timeouts, isend/irecv) runs on procgroup's tcp channel,
and collectives run on gloo, where every rank calls the same op in the same order and
blocking in C++ is harmless. Ops gloo lacks (all_to_all; bitwise reductions; int16 and
complex products) use the core's algorithms over that side channel.

Timeouts: gloo's own context timeout is fixed at 30 s (pygloo cannot set it). When the
channel's timeout is shorter, each collective first checks over the side channel that
every rank arrived (option ``arrival_check``), so the caller's timeout holds and the
error names the missing ranks; ``barrier`` always works that way. A failed gloo call
closes this rank's gloo connections (peers blocked on it fail at once instead of after
30 s) and breaks the channel.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from procgroup._netif import choose_address
from procgroup.channel import ChannelContext, DataChannel, Work
from procgroup.errors import (
    ChannelClosedError,
    CommTimeoutError,
    PeerError,
    ProcGroupError,
)
from procgroup.ops import ReduceOp, finish_average

from . import _options
from ._dtypes import address, byte_view, flat, reduce_plan
from ._rendezvous import connect_context, create_device

log = logging.getLogger(__name__)

#: Seconds to wait for the side channel to name a dead peer after gloo reported a failure.
_PEER_NAMING_GRACE = 2.0
#: Largest reduce output (bytes) a non-root keeps between calls.
_SCRATCH_LIMIT = 16 * 2**20


class GlooChannel(DataChannel):
    """One gloo context (full mesh) plus the TCP side channel it was rendezvoused over."""

    backend_name = "gloo"

    def __init__(self, ctx: ChannelContext, *, p2p: DataChannel | None = None, device: Any = None,
                 root: DataChannel | None = None) -> None:
        super().__init__(ctx)
        import pygloo

        self._pg = pygloo
        self._u8 = pygloo.glooDataType_t.glooUint8
        self._algorithm = _options.allreduce_algorithm(ctx.options)
        self._check_arrival = _options.arrival_check(ctx.options, ctx.timeout)
        if p2p is None:
            from procgroup_tcp.channel import TcpChannel

            # point to point and fallbacks only: the tcp collectives' shared memory stays off
            p2p = TcpChannel(dataclasses.replace(ctx, options={**ctx.options, "shm": False}))
        self._p2p = p2p
        self._root = root if root is not None else p2p  # the world's TcpChannel
        self._device = device
        self._context: Any = None
        self._broken: BaseException | None = None
        self._tag = 0
        self._scratch = np.empty(0, dtype=np.uint8)  # reduce's output on non-roots, reused
        if ctx.size > 1:
            try:
                if self._device is None:
                    self._device = create_device(choose_address(ctx.master_addr, ctx.options.get("ifname")))
                self._context = connect_context(ctx, p2p, self._device, self.next_collective_tag())
            except BaseException:
                p2p.close()
                raise
        log.debug("gloo channel rank %d/%d (group %d) ready", ctx.rank, ctx.size, ctx.group_id)

    # ------------------------------------------------------------------ point to point
    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        self.check_open()
        self._p2p.send(array, dst, tag)

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        self.check_open()
        return self._p2p.recv(array, src, tag)

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        self.check_open()
        return self._p2p.isend(array, dst, tag)

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        self.check_open()
        return self._p2p.irecv(array, src, tag)

    # ------------------------------------------------------------------ gloo calls
    def _next_tag(self) -> int:
        self._tag = (self._tag + 1) & 0xFFFFFFFF  # gloo tags are uint32
        return self._tag

    def _call(self, op: str, fn: Callable[..., None], *args: Any) -> None:
        """Run one pygloo collective; turn gloo's RuntimeError into procgroup's errors."""
        self._usable()
        if self._check_arrival:
            self._arrive(op)
        try:
            fn(self._context, *args)
        except RuntimeError as exc:
            raise self._fail(op, exc) from exc

    def _usable(self) -> None:
        if self._closed:
            raise ChannelClosedError("the gloo channel is closed (destroy_process_group was called)")
        if self._broken is not None:
            # a fresh copy each time: re-raising one instance would stack tracebacks on it
            raise copy.copy(self._broken).with_traceback(None) from self._broken

    def _arrive(self, op: str) -> None:
        """Return once every rank entered this collective; else time out naming the absent."""
        tag = self.next_collective_tag()
        mark = np.ones(1, dtype=np.uint8)
        peers = [r for r in range(self.size) if r != self.rank]
        for peer in peers:
            self._p2p.send(mark, peer, tag)
        deadline = time.monotonic() + self.timeout
        missing = []
        for peer in peers:
            work = self._p2p.irecv(np.zeros(1, dtype=np.uint8), peer, tag)
            try:
                work.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except CommTimeoutError:
                missing.append(self.ctx.global_rank(peer))
        if missing:
            who = ", ".join(f"rank {r}" for r in missing)
            exc = CommTimeoutError(f"{op}: {who} did not join within {self.timeout}s", op=op, ranks=missing)
            self._broken = exc
            raise exc

    def _fail(self, op: str, exc: RuntimeError) -> ProcGroupError:
        """Break the channel after a gloo error; name the dead peer when the side channel knows it."""
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        self._close_gloo()  # peers blocked on this rank now fail at once
        peer_error = self._side_channel_failure()
        err: ProcGroupError
        if peer_error is not None:
            err = PeerError(f"{op}: {peer_error} (gloo: {detail})", rank=getattr(peer_error, "rank", None))
        elif "timed out" in detail.lower() or "timeout" in detail.lower():
            err = CommTimeoutError(
                f"{op}: gloo made no progress within its fixed {_options.GLOO_TIMEOUT:g}s context timeout "
                f"(a rank did not join, or is stuck; to wait up to the procgroup timeout instead, set "
                f"{_options.ENV_ARRIVAL_CHECK}=always): {detail}", op=op,
            )
        else:
            err = PeerError(f"{op}: gloo failed: {detail}")
        self._broken = err
        log.error("procgroup gloo: %s", err)
        return err

    def _side_channel_failure(self) -> BaseException | None:
        # TcpChannel keeps the PeerError of a connection that dropped without goodbye
        deadline = time.monotonic() + _PEER_NAMING_GRACE
        while True:
            broken = getattr(self._root, "failure", None)
            if broken is not None or time.monotonic() >= deadline:
                return broken
            time.sleep(0.02)

    def _close_gloo(self) -> None:
        context, self._context = self._context, None
        if context is not None:
            try:
                context.closeConnections()
            except RuntimeError:
                log.debug("gloo closeConnections failed", exc_info=True)

    def _scratch_like(self, a: np.ndarray) -> np.ndarray:
        """A buffer shaped like ``a``: reused up to :data:`_SCRATCH_LIMIT` bytes (gloo calls
        on a channel never overlap), a temporary one above, so one huge reduce does not
        pin its size for the channel's lifetime."""
        if a.nbytes > _SCRATCH_LIMIT:
            return np.empty_like(a)
        if self._scratch.nbytes < a.nbytes:
            self._scratch = np.empty(a.nbytes, dtype=np.uint8)
        return self._scratch[:a.nbytes].view(a.dtype).reshape(a.shape)

    # ------------------------------------------------------------------ collectives
    def broadcast(self, array: Any, src: int) -> None:
        if self.size == 1 or array.nbytes == 0:
            return
        b = byte_view(array)
        p = address(b)
        self._call("broadcast", self._pg.broadcast, p, p, b.size, self._u8, src, self._next_tag())

    def all_reduce(self, array: Any, op: ReduceOp) -> None:
        if self.size == 1 or array.size == 0:
            return
        plan = reduce_plan(array.dtype, op)
        if plan is None:
            return super().all_reduce(array, op)
        a = array if plan.view is None else flat(array, plan.view)
        p = address(a)
        self._call("all_reduce", self._pg.allreduce, p, p, a.size, plan.gloo_dtype, plan.gloo_op,
                   self._algorithm, self._next_tag())
        if plan.average:
            finish_average(ReduceOp.AVG, array, self.size)

    def reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        if self.size == 1 or array.size == 0:
            return
        plan = reduce_plan(array.dtype, op)
        if plan is None:
            return super().reduce(array, dst, op)
        a = flat(array, plan.view)
        # gloo accumulates into the output on every rank: non-roots keep their array intact
        out = a if self.rank == dst else self._scratch_like(a)
        self._call("reduce", self._pg.reduce, address(a), address(out), a.size, plan.gloo_dtype,
                   plan.gloo_op, dst, self._next_tag())
        if self.rank == dst and plan.average:
            finish_average(ReduceOp.AVG, array, self.size)

    def all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        if self.size == 1:
            return super().all_gather(output_list, array)
        n = array.nbytes
        if n == 0:
            return
        dest, staged = _landing(output_list, n)
        self._call("all_gather", self._pg.allgather, address(byte_view(array)), address(dest), n, self._u8,
                   self._next_tag())
        if staged:
            _spread(dest, output_list, n)

    def gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        if self.size == 1:
            return super().gather(array, gather_list, dst)
        n = array.nbytes
        if n == 0:
            return
        src = byte_view(array)
        dest, staged = _landing(gather_list, n) if self.rank == dst and gather_list is not None else (src, False)
        self._call("gather", self._pg.gather, address(src), address(dest), n, self._u8, dst, self._next_tag())
        if staged and gather_list is not None:
            _spread(dest, gather_list, n)

    def scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        if self.size == 1:
            return super().scatter(array, scatter_list, src)
        n = array.nbytes
        if n == 0:
            return
        out = byte_view(array)
        if self.rank == src and scatter_list is not None:
            inputs = [address(byte_view(a)) for a in scatter_list]
        else:
            inputs = [address(out)] * self.size  # ignored by gloo off the root
        self._call("scatter", self._pg.scatter, inputs, address(out), n, self._u8, src, self._next_tag())

    def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        if self.size == 1 or output.size == 0:
            return super().reduce_scatter(output, input_list, op)
        plan = reduce_plan(output.dtype, op)
        if plan is None:
            return super().reduce_scatter(output, input_list, op)
        out = flat(output, plan.view)
        n = out.size
        # pygloo copies the input into a buffer of its own anyway; join the list only if needed
        joined, _ = _landing(input_list, output.nbytes, fill=True)
        whole = joined.view(out.dtype)
        self._call("reduce_scatter", _reduce_scatter, address(whole), address(out), n * self.size,
                   [n] * self.size, plan.gloo_dtype, plan.gloo_op)
        if plan.average:
            finish_average(ReduceOp.AVG, output, self.size)

    def barrier(self) -> None:
        """Every rank tells every other one it arrived, over the side channel.

        Not gloo's barrier: a barrier is where ranks wait for a slow one (a checkpoint
        write, ...), and gloo gives up after its fixed 30 s; this waits up to the
        channel's timeout without holding the GIL and names the ranks that never came.
        """
        if self.size == 1:
            return
        self._usable()
        self._arrive("barrier")

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        """A gloo context of the group's own, its keys exchanged over the side channel."""
        self.check_open()
        sub = self._p2p.new_group(list(ranks), ctx)
        return GlooChannel(ctx, p2p=sub, device=self._device, root=self._root)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_gloo()
        try:
            self._p2p.close()
        finally:
            self.shutdown_threads()


def _reduce_scatter(context: Any, sendbuf: int, recvbuf: int, size: int, counts: list[int],
                    dtype: Any, op: Any) -> None:
    import pygloo

    pygloo.reduce_scatter(context, sendbuf, recvbuf, size, counts, dtype, op)


def _landing(arrays: Sequence[Any], nbytes: int, fill: bool = False) -> tuple[np.ndarray, bool]:
    """One uint8 buffer over ``arrays`` laid end to end: their own memory when it already
    is contiguous (no copy), else a new buffer (``staged`` True), filled from them if ``fill``."""
    base = address(byte_view(arrays[0]))
    if all(address(byte_view(a)) == base + i * nbytes for i, a in enumerate(arrays)):
        raw = (ctypes.c_uint8 * (nbytes * len(arrays))).from_address(base)
        return np.frombuffer(raw, dtype=np.uint8), False
    buf = np.empty(nbytes * len(arrays), dtype=np.uint8)
    for i, a in enumerate(arrays if fill else ()):
        buf[i * nbytes:(i + 1) * nbytes] = byte_view(a)
    return buf, True


def _spread(buf: np.ndarray, arrays: Sequence[Any], nbytes: int) -> None:
    for i, a in enumerate(arrays):
        byte_view(a)[:] = buf[i * nbytes:(i + 1) * nbytes]


__all__ = ["GlooChannel"]
