"""GlooChannel: gloo collectives on the caller's memory, p2p on a host side channel.

The gloo calls go through an engine (_engine.py): pygloo where it is importable, else
torch.distributed's ProcessGroupGloo (option ``engine`` / $PROCGROUP_GLOO_ENGINE picks
one). Everything else is the channel's and the same on both engines.

Why two transports: pygloo holds the GIL for the whole of every gloo call, and gloo's
send blocks until the receiver has posted its recv (measured: a 16-byte send waits for
the receiver; a thread blocked in pygloo.recv stops every other thread of the process).
With p2p on gloo an ``irecv`` would freeze its own process, so the ``isend``/``recv``
pairs the API promises would deadlock; and gloo's recv needs an explicit peer. So
point-to-point (any-source, tags, timeouts, isend/irecv) runs on a side channel that
the registry picks (``ctx.open_side_channel``: tcp), and collectives run on gloo, where
every rank calls the same op in the same order and blocking in C++ is harmless. Ops
gloo lacks (all_to_all; some dtype x op pairs, per engine) use the SDK's generic
algorithms over that side channel.

Timeouts: pygloo's context timeout is fixed at 30 s (torch's is procgroup's). When the
channel's timeout is shorter, each collective first checks over the side channel that
every rank arrived (option ``arrival_check``), so the caller's timeout holds and the
error names the missing ranks; ``barrier`` always works that way. A failed gloo call
closes this rank's gloo connections where the engine can (peers blocked on it fail at
once instead of after the timeout) and breaks the channel.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from procgroup.backend import (
    ChannelContext,
    DataChannel,
    Work,
    flat_view,
    fresh,
    late_peers,
    poll,
    setting,
)
from procgroup.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    CommTimeoutError,
    GroupRevokedError,
    InvalidArgumentError,
    PeerError,
    ProcGroupError,
)
from procgroup.ops import ReduceOp

from . import _engine, _options
from ._memory import byte_view, landing, spread

log = logging.getLogger(__name__)

#: Seconds to wait for the side channel to name a dead peer after gloo reported a failure.
_PEER_NAMING_GRACE = 2.0
#: Largest reduce output (bytes) a non-root keeps between calls.
_SCRATCH_LIMIT = 16 * 2**20


def open_side_channel(ctx: ChannelContext, *, holds_gil: bool = True) -> DataChannel:
    """The host p2p channel of the best installed side-channel backend, without a
    collective arena (it carries point-to-point and fallbacks only; on one host that
    point-to-point still goes through shared memory). ``holds_gil``: the engine keeps the
    GIL through a gloo call (pygloo; torch releases it)."""
    if ctx.open_side_channel is None:
        raise BackendNotFoundError("backend 'gloo' needs a host side channel, and this context offers none")
    options = {**ctx.options, "arena": False}
    # a rank blocked in a pygloo call holds its GIL, so its heartbeats stop: the side
    # channel waits longer than gloo's own timeout before it counts such a rank dead
    beat, _ = setting("heartbeat_timeout", "PROCGROUP_HEARTBEAT_TIMEOUT", "10", ctx.options)
    try:
        if holds_gil and 0 < float(beat) < _options.GLOO_TIMEOUT + 5:
            options["heartbeat_timeout"] = _options.GLOO_TIMEOUT + 5
    except ValueError:
        pass  # "off", or a bad value the side channel reports
    return ctx.open_side_channel(dataclasses.replace(ctx, options=options))


def engine_class(options: Mapping[str, Any]) -> type[_engine.Engine]:
    """The Engine to run for these options, imported now; BackendUnavailableError if none can."""
    name, why = _engine.resolve(options)
    if name is None:
        raise BackendUnavailableError(f"backend 'gloo' cannot run here: {why}")
    if name == "pygloo":
        from ._engine_pygloo import PyglooEngine

        return PyglooEngine
    from ._engine_torch import TorchEngine

    return TorchEngine


class _PeerLost(RuntimeError):
    """A member's side-channel connection dropped while this rank waited in gloo."""


class GlooChannel(DataChannel):
    """One gloo context (full mesh, through an engine) plus the side channel it was
    rendezvoused over."""

    backend_name = "gloo"

    def __init__(self, ctx: ChannelContext, *, p2p: DataChannel | None = None, device: Any = None,
                 root: DataChannel | None = None, engine: type[_engine.Engine] | None = None) -> None:
        super().__init__(ctx)
        self._engine_class = engine if engine is not None else engine_class(ctx.options)
        self._table = self._engine_class.table
        self._algorithm = _options.allreduce_algorithm(ctx.options)
        self._check_arrival = _options.arrival_check(ctx.options, ctx.timeout)
        if p2p is None:
            p2p = open_side_channel(ctx, holds_gil=self._engine_class.name == "pygloo")
        self._p2p = p2p
        self._root = root if root is not None else p2p  # the world's side channel
        self._device = device
        self._engine: _engine.Engine | None = None
        self._scratch = np.empty(0, dtype=np.uint8)  # reduce's output on non-roots, reused
        self._revoked: GroupRevokedError | None = None  # a revoke, also after a death failed the collectives
        if ctx.size > 1:
            try:
                if engine is None:  # a group inherits its world's engine, agreed on already
                    self._agree_on_engine()
                self._engine = self._engine_class.connect(
                    ctx, p2p, device, self._algorithm, self._interrupt, self.next_collective_tag())
                self._device = self._engine.device
            except BaseException:
                p2p.close()
                raise
        p2p.carry_control(self, {r: r for r in range(ctx.size)})  # revoke/agree/deaths reach it
        log.debug("gloo channel rank %d/%d (group %d) ready, engine %s", ctx.rank, ctx.size, ctx.group_id,
                  self._engine_class.name)

    @property
    def engine(self) -> str:
        """The engine that drives gloo here: "pygloo" or "torch"."""
        return self._engine_class.name

    def _agree_on_engine(self) -> None:
        """Every member tells every other one its engine (side channel, one byte): a mix
        would hang in the rendezvous, so it is an error naming the ranks that differ."""
        mine = _options.ENGINES.index(self._engine_class.name)
        tag = self.next_collective_tag()
        peers = [r for r in range(self.size) if r != self.rank]
        for peer in peers:
            self._p2p.send(np.full(1, mine, dtype=np.uint8), peer, tag)
        theirs = [(peer, np.zeros(1, dtype=np.uint8)) for peer in peers]
        works = [(peer, self._p2p.irecv(buf, peer, tag)) for peer, buf in theirs]
        late = late_peers(works, self.timeout)
        if late:
            who = ", ".join(f"rank {self.ctx.global_rank(r)}" for r in late)
            raise CommTimeoutError(f"gloo: {who} did not start the gloo backend within {self.timeout}s",
                                   op="init", ranks=[self.ctx.global_rank(r) for r in late])
        other = [(self.ctx.global_rank(peer), _options.ENGINES[int(buf[0])]) for peer, buf in theirs
                 if int(buf[0]) != mine]
        if other:
            who = ", ".join(f"rank {r} runs {name}" for r, name in other)
            raise InvalidArgumentError(
                f"gloo: every rank must use the same engine; this rank (rank {self.ctx.global_rank(self.rank)}) "
                f"runs {self._engine_class.name}, but {who}: set {_options.ENV_ENGINE} (or the option "
                f"'engine') to the same value on every rank")

    def _interrupt(self) -> None:
        """Called by an engine between slices of a wait: end it when the channel was
        closed or broken (a revoke), or when the side channel lost a member of this group."""
        if self._closed or self._failure is not None:
            self.check_usable()
        failure = self._root.failure
        if failure is not None:
            lost = getattr(failure, "rank", None)
            members = self.ctx.global_ranks or tuple(range(self.size))
            if lost is None or lost in members:
                raise _PeerLost(str(failure))

    # ------------------------------------------------------------------ point to point
    # Both forms: the blocking one is the side channel's own blocking call, cheaper than
    # a started one; the started one is the side channel's (native) isend/irecv.
    def _check_open(self) -> None:
        # p2p stays usable after a gloo failure or a death: only closing (or a revoke) ends it
        if self._closed or isinstance(self._failure, GroupRevokedError):
            self.check_usable()
        if self._revoked is not None:  # revoked after a death had failed the collectives
            raise fresh(self._revoked)

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
    def _call(self, op: str, fn: Callable[..., None], *args: Any) -> None:
        """Run one engine collective; turn gloo's RuntimeError into procgroup's errors."""
        self.check_usable()
        if self._check_arrival:
            self._arrive(op)
        try:
            fn(*args)
        except ProcGroupError:
            raise
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

    def _gloo_failed(self, op: str, exc: RuntimeError) -> BaseException:
        """Break the channel after a gloo error; name the dead peer when the side channel
        knows it, or report the revoke that closed a member's gloo connections."""
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, _PeerLost):  # the side channel saw it first; gloo's op was abandoned
            detail = "the op was abandoned"
        self._close_gloo()  # peers blocked on this rank now fail at once
        peer_error = self._side_channel_failure()
        err: ProcGroupError
        if isinstance(peer_error, GroupRevokedError):  # a member revoked the group mid-op
            return fresh(peer_error)
        if peer_error is not None:
            err = PeerError(f"{op}: {peer_error} (gloo: {detail})", rank=getattr(peer_error, "rank", None))
        elif "timed out" in detail.lower() or "timeout" in detail.lower():
            err = CommTimeoutError(
                f"{op}: gloo made no progress within {self._gloo_timeout()} (a rank did not join, or "
                f"is stuck{self._timeout_hint()}): {detail}", op=op,
            )
        else:
            err = PeerError(f"{op}: gloo failed: {detail}")
        self.fail(err)
        return err

    def _gloo_timeout(self) -> str:
        if self._engine_class.name == "pygloo":
            return f"its fixed {_options.GLOO_TIMEOUT:g}s context timeout"
        return f"the timeout of {self.timeout:g}s"

    def _timeout_hint(self) -> str:
        if self._engine_class.name == "pygloo":
            return f"; to wait up to the procgroup timeout instead, set {_options.ENV_ARRIVAL_CHECK}=always"
        return f"; to have the late ranks named, set {_options.ENV_ARRIVAL_CHECK}=always"

    def _side_channel_failure(self) -> BaseException | None:
        """The death of a member of this group that the side channel reported (it fails
        this channel: ``fail_peer``), or a revoke of this group, if one comes within a
        short grace (the socket's reset, or the revoke's message, may trail gloo's error:
        a revoker closes its gloo connections before it tells the members); or the side
        channel's own break."""
        root = self._root

        def known() -> BaseException | None:
            mine = self._failure
            if isinstance(mine, PeerError):
                return mine
            if self._revoked is not None:
                return self._revoked
            return mine if isinstance(mine, GroupRevokedError) else root.failure

        try:
            poll(lambda: known() is not None, _PEER_NAMING_GRACE, what="naming the failed peer")
        except CommTimeoutError:
            pass
        return known()

    def _close_gloo(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def _gloo(self) -> _engine.Engine:
        """The engine; only None after a failure or close, which check_usable reports first."""
        engine = self._engine
        if engine is None:
            self.check_usable()
            raise PeerError("gloo: the gloo context is closed")
        return engine

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
        self._call("broadcast", self._gloo().broadcast, byte_view(array), src)

    def do_all_reduce(self, array: Any, op: ReduceOp) -> None:
        if self.size == 1 or array.size == 0:
            return
        plan = self._table.lower(array.dtype, op)
        if plan is None:
            return super().do_all_reduce(array, op)
        self._call("all_reduce", self._gloo().all_reduce, flat_view(array, plan.view), plan)
        if plan.divide:
            array /= self.size

    def do_reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        if self.size == 1 or array.size == 0:
            return
        plan = self._table.lower(array.dtype, op)
        if plan is None:
            return super().do_reduce(array, dst, op)
        a = flat_view(array, plan.view)
        # gloo writes into the output on every rank: non-roots keep their array intact
        scratch = None if self.rank == dst else self._scratch_like(a)
        self._call("reduce", self._gloo().reduce, a, scratch, plan, dst)
        if self.rank == dst and plan.divide:
            array /= self.size

    def do_all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        if self.size == 1:
            return super().do_all_gather(output_list, array)
        n = array.nbytes
        if n == 0:
            return
        dest, staged = landing(output_list, n)
        self._call("all_gather", self._gloo().all_gather, byte_view(array), dest)
        if staged:
            spread(dest, output_list, n)

    def do_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        if self.size == 1:
            return super().do_gather(array, gather_list, dst)
        n = array.nbytes
        if n == 0:
            return
        root = self.rank == dst and gather_list is not None
        dest, staged = landing(gather_list, n) if root and gather_list is not None else (None, False)
        self._call("gather", self._gloo().gather, byte_view(array), dest, dst)
        if staged and dest is not None and gather_list is not None:
            spread(dest, gather_list, n)

    def do_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        if self.size == 1:
            return super().do_scatter(array, scatter_list, src)
        if array.nbytes == 0:
            return
        inputs = [byte_view(a) for a in scatter_list] if self.rank == src and scatter_list is not None else None
        self._call("scatter", self._gloo().scatter, inputs, byte_view(array), src)

    def do_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        if self.size == 1 or output.size == 0:
            return super().do_reduce_scatter(output, input_list, op)
        plan = self._table.lower(output.dtype, op)
        if plan is None:
            return super().do_reduce_scatter(output, input_list, op)
        out = flat_view(output, plan.view)
        # pygloo copies the input into a buffer of its own anyway; join the list only if needed
        joined, _ = landing(input_list, output.nbytes, fill=True)
        self._call("reduce_scatter", self._gloo().reduce_scatter, joined.view(out.dtype), out, plan)
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
        call (holding its GIL, deaf to notices) fails at once instead of after 30 s.

        A death of a member comes here too (``DataChannel.fail_peer``'s default): a gloo
        context fails as a whole, so its collectives do; the point-to-point, on the side
        channel, keeps its own scope (``_check_open``). A group without the dead rank has
        a context of its own and goes on."""
        first = self.fail(exc)
        self._close_gloo()
        if isinstance(exc, GroupRevokedError) and self._revoked is None:
            self._revoked = exc
            interrupt = getattr(self._p2p, "interrupt", None)
            if interrupt is not None:  # the group's point-to-point, on the side channel, too
                interrupt(exc)
        return first

    def failure_ack(self) -> None:
        """Acknowledge the deaths known now; any-source receives run on the side channel."""
        self._p2p.failure_ack()  # type: ignore[attr-defined]  # a tcp channel: the registry's side channel

    def failure_get_acked(self) -> list[int]:
        return list(self._p2p.failure_get_acked())  # type: ignore[attr-defined]  # as above

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        """A gloo context of the group's own, its keys exchanged over the side channel."""
        self._check_open()
        sub = self._p2p.new_group(list(ranks), ctx)
        return GlooChannel(ctx, p2p=sub, device=self._device, root=self._root, engine=self._engine_class)

    # ------------------------------------------------------------------ teardown
    def do_close(self) -> None:
        self._close_gloo()
        self._p2p._children.pop(self.control_id, None)
        self._p2p.close()


__all__ = ["GlooChannel", "engine_class", "open_side_channel"]
