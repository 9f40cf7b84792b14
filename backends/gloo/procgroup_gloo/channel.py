"""GlooChannel: collectives through pygloo on the caller's memory, p2p on a host side channel.

Why two transports: pygloo holds the GIL for the whole of every gloo call, and gloo's
send blocks until the receiver has posted its recv (measured: a 16-byte send waits for
the receiver; a thread blocked in pygloo.recv stops every other thread of the process).
With p2p on gloo an ``irecv`` would freeze its own process, so the ``isend``/``recv``
pairs the API promises would deadlock; and gloo's recv needs an explicit peer. So
point-to-point (any-source, tags, timeouts, isend/irecv) runs on a side channel that
the registry picks (``ctx.open_side_channel``: tcp), and collectives run on gloo, where
every rank calls the same op in the same order and blocking in C++ is harmless. Ops
gloo lacks (all_to_all; bitwise reductions; int16 and complex products) use the SDK's
generic algorithms over that side channel.

Timeouts: gloo's own context timeout is fixed at 30 s (pygloo cannot set it). When the
channel's timeout is shorter, each collective first checks over the side channel that
every rank arrived (option ``arrival_check``), so the caller's timeout holds and the
error names the missing ranks; ``barrier`` always works that way. A failed gloo call
closes this rank's gloo connections (peers blocked on it fail at once instead of after
30 s) and breaks the channel.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from procgroup.backend import (
    ChannelContext,
    DataChannel,
    Work,
    flat_view,
    host_address,
    late_peers,
    poll,
    setting,
)
from procgroup.errors import (
    BackendNotFoundError,
    CommTimeoutError,
    GroupRevokedError,
    PeerError,
    ProcGroupError,
)
from procgroup.ops import ReduceOp

from . import _options
from ._dtypes import lower
from ._memory import address, byte_view, landing, spread
from ._rendezvous import connect_context, create_device

log = logging.getLogger(__name__)

#: Seconds to wait for the side channel to name a dead peer after gloo reported a failure.
_PEER_NAMING_GRACE = 2.0
#: Largest reduce output (bytes) a non-root keeps between calls.
_SCRATCH_LIMIT = 16 * 2**20


def open_side_channel(ctx: ChannelContext) -> DataChannel:
    """The host p2p channel of the best installed side-channel backend, shared memory off
    (it carries point-to-point and fallbacks only)."""
    if ctx.open_side_channel is None:
        raise BackendNotFoundError("backend 'gloo' needs a host side channel, and this context offers none")
    options = {**ctx.options, "shm": False}
    # a rank blocked in a gloo call holds its GIL, so its heartbeats stop: the side channel
    # waits longer than gloo's own timeout before it counts such a rank dead
    beat, _ = setting("heartbeat_timeout", "PROCGROUP_HEARTBEAT_TIMEOUT", "10", ctx.options)
    try:
        if 0 < float(beat) < _options.GLOO_TIMEOUT + 5:
            options["heartbeat_timeout"] = _options.GLOO_TIMEOUT + 5
    except ValueError:
        pass  # "off", or a bad value the side channel reports
    return ctx.open_side_channel(dataclasses.replace(ctx, options=options))


class GlooChannel(DataChannel):
    """One gloo context (full mesh) plus the side channel it was rendezvoused over."""

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
            p2p = open_side_channel(ctx)
        self._p2p = p2p
        self._root = root if root is not None else p2p  # the world's side channel
        self._device = device
        self._context: Any = None
        self._tag = 0
        self._scratch = np.empty(0, dtype=np.uint8)  # reduce's output on non-roots, reused
        if ctx.size > 1:
            try:
                if self._device is None:
                    self._device = create_device(host_address(ctx))
                self._context = connect_context(ctx, p2p, self._device, self.next_collective_tag())
            except BaseException:
                p2p.close()
                raise
        p2p.carry_control(self, {r: r for r in range(ctx.size)})  # revoke/agree/deaths reach it
        log.debug("gloo channel rank %d/%d (group %d) ready", ctx.rank, ctx.size, ctx.group_id)

    # ------------------------------------------------------------------ point to point
    # Both forms: the blocking one is the side channel's own blocking call, cheaper than
    # a started one; the started one is the side channel's (native) isend/irecv.
    def _check_open(self) -> None:
        # p2p stays usable after a gloo failure: only closing (or a revoke) ends it
        if self._closed or isinstance(self._failure, GroupRevokedError):
            self.check_usable()

    def do_send(self, array: Any, dst: int, tag: int = 0) -> None:
        self._check_open()
        self._p2p.send(array, dst, tag)

    def start_send(self, array: Any, dst: int, tag: int = 0) -> Work:
        self._check_open()
        return self._p2p.isend(array, dst, tag)

    def do_recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        self._check_open()
        return self._p2p.recv(array, src, tag)

    def start_recv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        self._check_open()
        return self._p2p.irecv(array, src, tag)

    # ------------------------------------------------------------------ gloo calls
    def _next_tag(self) -> int:
        self._tag = (self._tag + 1) & 0xFFFFFFFF  # gloo tags are uint32
        return self._tag

    def _call(self, op: str, fn: Callable[..., None], *args: Any) -> None:
        """Run one pygloo collective; turn gloo's RuntimeError into procgroup's errors."""
        self.check_usable()
        if self._check_arrival:
            self._arrive(op)
        try:
            fn(self._context, *args)
        except RuntimeError as exc:
            raise self._gloo_failed(op, exc) from exc

    def _arrive(self, op: str) -> None:
        """Return once every rank entered this collective; else time out naming the absent."""
        tag = self.next_collective_tag()
        mark = np.ones(1, dtype=np.uint8)
        peers = [r for r in range(self.size) if r != self.rank]
        for peer in peers:
            self._p2p.send(mark, peer, tag)
        marks = [(peer, self._p2p.irecv(np.zeros(1, dtype=np.uint8), peer, tag)) for peer in peers]
        missing = [self.ctx.global_rank(peer) for peer in late_peers(marks, self.timeout)]
        if missing:
            who = ", ".join(f"rank {r}" for r in missing)
            exc = CommTimeoutError(f"{op}: {who} did not join within {self.timeout}s", op=op, ranks=missing)
            self.fail(exc)
            raise exc

    def _gloo_failed(self, op: str, exc: RuntimeError) -> ProcGroupError:
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
        self.fail(err)
        return err

    def _side_channel_failure(self) -> BaseException | None:
        """The side channel's record of a peer that dropped without goodbye, if it has one
        within a short grace (the socket's reset may trail gloo's error)."""
        root = self._root
        try:
            poll(lambda: root.failure is not None, _PEER_NAMING_GRACE, what="naming the failed peer")
        except CommTimeoutError:
            pass
        return root.failure

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
    def do_broadcast(self, array: Any, src: int) -> None:
        if self.size == 1 or array.nbytes == 0:
            return
        b = byte_view(array)
        p = address(b)
        self._call("broadcast", self._pg.broadcast, p, p, b.size, self._u8, src, self._next_tag())

    def do_all_reduce(self, array: Any, op: ReduceOp) -> None:
        if self.size == 1 or array.size == 0:
            return
        plan = lower(array.dtype, op)
        if plan is None:
            return super().do_all_reduce(array, op)
        a = array if plan.view is None else flat_view(array, plan.view)
        p = address(a)
        self._call("all_reduce", self._pg.allreduce, p, p, a.size, plan.dtype, plan.op,
                   self._algorithm, self._next_tag())
        if plan.divide:
            array /= self.size

    def do_reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        if self.size == 1 or array.size == 0:
            return
        plan = lower(array.dtype, op)
        if plan is None:
            return super().do_reduce(array, dst, op)
        a = flat_view(array, plan.view)
        # gloo accumulates into the output on every rank: non-roots keep their array intact
        out = a if self.rank == dst else self._scratch_like(a)
        self._call("reduce", self._pg.reduce, address(a), address(out), a.size, plan.dtype,
                   plan.op, dst, self._next_tag())
        if self.rank == dst and plan.divide:
            array /= self.size

    def do_all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        if self.size == 1:
            return super().do_all_gather(output_list, array)
        n = array.nbytes
        if n == 0:
            return
        dest, staged = landing(output_list, n)
        self._call("all_gather", self._pg.allgather, address(byte_view(array)), address(dest), n, self._u8,
                   self._next_tag())
        if staged:
            spread(dest, output_list, n)

    def do_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        if self.size == 1:
            return super().do_gather(array, gather_list, dst)
        n = array.nbytes
        if n == 0:
            return
        src = byte_view(array)
        dest, staged = landing(gather_list, n) if self.rank == dst and gather_list is not None else (src, False)
        self._call("gather", self._pg.gather, address(src), address(dest), n, self._u8, dst, self._next_tag())
        if staged and gather_list is not None:
            spread(dest, gather_list, n)

    def do_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        if self.size == 1:
            return super().do_scatter(array, scatter_list, src)
        n = array.nbytes
        if n == 0:
            return
        out = byte_view(array)
        if self.rank == src and scatter_list is not None:
            inputs = [address(byte_view(a)) for a in scatter_list]
        else:
            inputs = [address(out)] * self.size  # ignored by gloo off the root
        self._call("scatter", self._pg.scatter, inputs, address(out), n, self._u8, src, self._next_tag())

    def do_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        if self.size == 1 or output.size == 0:
            return super().do_reduce_scatter(output, input_list, op)
        plan = lower(output.dtype, op)
        if plan is None:
            return super().do_reduce_scatter(output, input_list, op)
        out = flat_view(output, plan.view)
        n = out.size
        # pygloo copies the input into a buffer of its own anyway; join the list only if needed
        joined, _ = landing(input_list, output.nbytes, fill=True)
        whole = joined.view(out.dtype)
        self._call("reduce_scatter", self._pg.reduce_scatter, address(whole), address(out), n * self.size,
                   [n] * self.size, plan.dtype, plan.op)
        if plan.divide:
            output /= self.size

    def do_barrier(self) -> None:
        """Every rank tells every other one it arrived, over the side channel.

        Not gloo's barrier: a barrier is where ranks wait for a slow one (a checkpoint
        write, ...), and gloo gives up after its fixed 30 s; this waits up to the
        channel's timeout without holding the GIL and names the ranks that never came.
        """
        if self.size == 1:
            return
        self.check_usable()
        self._arrive("barrier")

    # ------------------------------------------------------------------ surviving a death
    # The control plane is the side channel's (docs/fault-tolerance.md); shrink builds a
    # new GlooChannel (a new side channel and gloo context) over the survivors' new Store.
    @property
    def control_id(self) -> int:
        return -1 - self.ctx.group_id  # apart from the side channel's own group id

    def do_control_send(self, dst: int, payload: bytes) -> None:
        self._p2p.do_control_send(dst, payload)

    def interrupt(self, exc: BaseException) -> bool:
        """Break the channel and close the gloo connections: a peer blocked in a gloo
        call (holding its GIL, deaf to notices) fails at once instead of after 30 s."""
        first = self.fail(exc)
        self._close_gloo()
        return first

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        """A gloo context of the group's own, its keys exchanged over the side channel."""
        self._check_open()
        sub = self._p2p.new_group(list(ranks), ctx)
        return GlooChannel(ctx, p2p=sub, device=self._device, root=self._root)

    # ------------------------------------------------------------------ teardown
    def do_close(self) -> None:
        self._close_gloo()
        self._p2p._children.pop(self.control_id, None)
        self._p2p.close()


__all__ = ["GlooChannel", "open_side_channel"]
