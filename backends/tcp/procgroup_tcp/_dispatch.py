"""The collectives of TcpChannel and TcpSubChannel, written once.

Each dispatcher runs its collective in the shared-memory arena when the channel has one
(only a root TcpChannel whose ranks are all on this host), else over the sockets:

1. :meth:`TcpCollectives._start` draws the collective's private tag, packs its
   fingerprint and registers it under that tag (the receive path compares it with every
   frame of the tag): a :class:`~procgroup_tcp._fingerprints.Collective` value;
2. the algorithm runs with that tag (``procgroup.algorithms``, or ``_collectives.Plan``
   for the ops it picks by size); a 0-byte collective, which the algorithms would skip,
   runs a barrier under its fingerprint instead (as ``barrier`` itself does: two levels
   where they apply), so a 0-byte vs non-0 disagreement is found too;
3. :meth:`TcpCollectives._end` takes the tag off the table and raises the mismatch
   found as it ran, or one of an earlier collective of this group (``Ledger.finished``).

Which algorithm runs over the sockets depends on the channel's topology (``_topology``,
learnt at its first collective): ranks on several hosts with several on some of them
take the two-level algorithms (``_collectives.TwoLevel``), every other channel the flat
ones (``_collectives.Plan`` and ``procgroup.algorithms``). Every rank of a channel sees
the same topology, so all take the same path under the same tag.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from procgroup.algorithms import direct, hierarchical, ring
from procgroup.algorithms.hierarchical import Topology
from procgroup.ops import ReduceOp

from ._collectives import Plan, TwoLevel
from ._fingerprints import NO_ROOT, Collective, Fingerprints, Ledger
from ._topology import channel_topology, two_level_wanted

if TYPE_CHECKING:
    from procgroup.backend import ChannelContext

    from ._shm import SharedMemoryArena

__all__ = ["TcpCollectives"]


class TcpCollectives:
    """Mixin of TcpChannel and TcpSubChannel, ahead of DataChannel in their MRO: the
    nine collective dispatchers. Its users set ``_shm`` (the arena, or None) and call
    :meth:`_init_collectives` with the transport's ledger."""

    #: the frames carry fingerprints: PROCGROUP_DEBUG=DETAIL needs no exchange of its own
    checks_agreement = True
    #: the shared-memory arena (a root channel with every rank on this host), else None
    _shm: SharedMemoryArena | None = None
    ctx: ChannelContext
    size: int

    def _init_collectives(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._fps = ledger.active  # tag -> fingerprint of each running collective
        self._fingerprints = Fingerprints()
        self._plan = Plan()  # which algorithm runs a collective over the sockets
        self._two = TwoLevel(self._plan, self.ctx.options)  # the same on several hosts with several ranks on some
        self._two_level_on = two_level_wanted(self.ctx.options)
        self._topo: Topology | None = None

    def _two_level(self) -> Topology | None:
        """The channel's topology when its collectives run in two levels, else None."""
        if not self._two_level_on:
            return None
        topo = self._topo
        if topo is None:
            topo = self._topo = channel_topology(self)
        return topo if topo.two_level else None

    if TYPE_CHECKING:
        def next_collective_tag(self) -> int: ...  # DataChannel's

    # ---------------------------------------------------------------- one collective
    def _start(self, op: str, array: Any, root: int = NO_ROOT, reduce_op: ReduceOp | None = None) -> Collective:
        call = Collective(self.next_collective_tag(), self._fingerprints.next(op, array, root, reduce_op))
        self._fps[call.tag] = call.fp
        return call

    def _run(self, call: Collective, array: Any, algorithm: Callable[..., None], *args: Any) -> None:
        """Run ``algorithm(*args)`` (its args hold ``call.tag``) under ``call``; see the module."""
        try:
            if self.size > 1 and (array is None or array.nbytes == 0):
                topo = self._topo if self._two_level_on else None  # looked up by the dispatcher
                if topo is not None and topo.two_level:
                    hierarchical.barrier(self, topo, call.tag)  # type: ignore[arg-type]  # a DataChannel by the MRO
                else:
                    direct.barrier(self, call.tag)  # type: ignore[arg-type]  # a DataChannel by the MRO
            else:
                algorithm(*args)
        except BaseException:
            self._fps.pop(call.tag, None)  # a failed collective is not remembered
            raise
        exc = self._ledger.finished(call.tag, call.fp, self.ctx.group_id)
        if exc is not None:
            raise exc

    # ---------------------------------------------------------------- the dispatchers
    def do_all_reduce(self, array: Any, op: ReduceOp) -> None:
        shm = self._shm
        if shm is not None:  # the latency-critical case, dispatched first
            shm.all_reduce(array, op)
            return
        topo = self._two_level()
        call = self._start("all_reduce", array, reduce_op=op)
        if topo is not None:
            self._run(call, array, self._two.all_reduce, self, topo, array, op, call.tag)
        else:
            self._run(call, array, self._plan.all_reduce, self, array, op, call.tag)

    def do_broadcast(self, array: Any, src: int) -> None:
        if self._shm is not None:
            self._shm.broadcast(array, src)
            return
        topo = self._two_level()
        call = self._start("broadcast", array, root=src)
        if topo is not None:
            self._run(call, array, self._two.broadcast, self, topo, array, src, call.tag)
        else:
            self._run(call, array, self._plan.broadcast, self, array, src, call.tag)

    def do_reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        if self._shm is not None:
            self._shm.reduce(array, dst, op)
            return
        topo = self._two_level()
        call = self._start("reduce", array, root=dst, reduce_op=op)
        if topo is not None:
            self._run(call, array, self._two.reduce, self, topo, array, dst, op, call.tag)
        else:
            self._run(call, array, self._plan.reduce, self, array, dst, op, call.tag)

    def do_all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        if self._shm is not None:
            self._shm.all_gather(list(output_list), array)
            return
        topo = self._two_level()
        call = self._start("all_gather", array)
        if topo is not None:
            self._run(call, array, hierarchical.all_gather, self, topo, output_list, array, call.tag)
        else:
            self._run(call, array, ring.all_gather, self, output_list, array, call.tag)

    def do_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        if self._shm is not None:  # the arena compares the ranks' calls; the data goes by p2p
            self._shm.agree("gather", array, dst)
        topo = self._two_level()
        call = self._start("gather", array, root=dst)
        if topo is not None:
            self._run(call, array, hierarchical.gather, self, topo, array, gather_list, dst, call.tag)
        else:
            self._run(call, array, direct.gather, self, array, gather_list, dst, call.tag)

    def do_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        if self._shm is not None:
            self._shm.agree("scatter", array, src)
        topo = self._two_level()
        call = self._start("scatter", array, root=src)
        if topo is not None:
            self._run(call, array, hierarchical.scatter, self, topo, array, scatter_list, src, call.tag)
        else:
            self._run(call, array, direct.scatter, self, array, scatter_list, src, call.tag)

    def do_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        if self._shm is not None:
            self._shm.reduce_scatter(output, list(input_list), op)
            return
        topo = self._two_level()
        call = self._start("reduce_scatter", output, reduce_op=op)
        if topo is not None:
            self._run(call, output, hierarchical.reduce_scatter, self, topo, output, input_list, op, call.tag)
        else:
            self._run(call, output, ring.reduce_scatter, self, output, input_list, op, call.tag)

    def do_all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> None:
        if self._shm is not None:
            self._shm.all_to_all(list(output_list), list(input_list))
            return
        topo = self._two_level()
        call = self._start("all_to_all", input_list[0])
        if topo is not None:
            self._run(call, input_list[0], hierarchical.all_to_all, self, topo, output_list, input_list, call.tag)
        else:
            self._run(call, input_list[0], direct.all_to_all, self, output_list, input_list, call.tag)

    def do_barrier(self) -> None:
        if self._shm is not None:
            self._shm.agree("barrier", None)
            return
        self._two_level()  # _run's barrier takes two levels where they apply
        call = self._start("barrier", None)
        self._run(call, None, direct.barrier, self, call.tag)
