"""MpiChannel: procgroup's DataChannel over MPI, one set of communicators per group.

Every op is written once, as ``start_<op>``: the native nonblocking MPI call on the
caller's buffer (no copies), returned as an :class:`~._work.MpiWork`; a blocking call
is that Work's ``wait()`` (procgroup.backend), which polls with the channel's timeout
so nothing blocks forever. Isend/Irecv, Ibcast, Iallreduce (``IN_PLACE``), Ireduce
(``IN_PLACE`` at the root), Iallgatherv/Igatherv/Iscatterv/Ialltoallv (lists of
separate arrays as one ``v`` buffer, :mod:`._buffers`), Ireduce_scatter_block, Ibarrier.
MPI runs a communicator's collectives in the order they were issued, so blocking and
started collectives need no queue. all_reduce also has a blocking form
(``do_all_reduce``): small all_reduces' latency cannot afford a Work per call. Tags are
routed over several communicators (:mod:`._comms`); reductions are lowered by
:mod:`._lowering`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import mpi4py

if "mpi4py.MPI" not in sys.modules:
    # loading this module (``python -m procgroup info`` lists the backend's ops) must not
    # start MPI: it is initialised on first use (_initialized), and finalised at exit
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = True
from mpi4py import MPI
from procgroup.backend import ChannelContext, DataChannel, choose_address, job_key
from procgroup.ops import ReduceOp, finish_average

from . import _abort, _cuda, _launcher, _ulfm
from ._buffers import concatenate, nbytes, span, spread
from ._comms import TagRoutes, create_group, world_comm
from ._lowering import PLANS, datatype_of, reduce_plan
from ._requests import park, translate, wait_all
from ._work import SPIN, MpiWork, RecvWork, SendWork, size_error

log = logging.getLogger(__name__)

_IN_PLACE = MPI.IN_PLACE
_BYTE = MPI.BYTE
_ANY_SOURCE = MPI.ANY_SOURCE
_Status = MPI.Status
_AVG = ReduceOp.AVG
_ADDRESS_BYTES = 512
_KEY_BYTES = 32


def _initialized() -> None:
    """MPI_Init_thread (at mpi4py's rc.thread_level) unless MPI already runs."""
    if not MPI.Is_initialized():
        level = {"single": MPI.THREAD_SINGLE, "funneled": MPI.THREAD_FUNNELED,
                 "serialized": MPI.THREAD_SERIALIZED}.get(str(mpi4py.rc.thread_level), MPI.THREAD_MULTIPLE)
        MPI.Init_thread(level)
        log.debug("MPI initialised (%s)", MPI.Get_library_version().splitlines()[0])


class MpiChannel(DataChannel):
    """The mpi backend's communicator; see the module docstring for the mapping."""

    backend_name = "mpi"
    cancels_recv = True  # MPI_Cancel
    #: How to start a world of ``size`` ranks: the core quotes it when a rank or size given
    #: to init_process_group contradicts MPI's
    launch_hint = "start the job with 'mpiexec -n {size} python ...' (mpiexec decides the ranks)"

    @property
    def shrink_unsupported(self) -> str:  # type: ignore[override]  # a property here, asked of MPI
        """Why revoke/agree/shrink are refused here, as this process's MPI library answers
        (:mod:`._ulfm`): ULFM does not work with the MPIs procgroup was tested with, and a
        death under mpiexec ends the whole job (docs/fault-tolerance.md, "mpi")."""
        return _ulfm.why_not()

    @classmethod
    def discover_world(cls) -> tuple[int, int]:
        """(rank, size) of ``COMM_WORLD``: mpiexec's answer, or a world of 1 without it.

        Asked whatever the init method (as the 2017 module did for MPI): the init method
        only serves the job's Store."""
        _initialized()
        world = MPI.COMM_WORLD
        _launcher.check_world(world.Get_size())  # a world of 1 where srun started N tasks
        return world.Get_rank(), world.Get_size()

    @classmethod
    def discover_store(cls, rank: int, size: int, timeout: float) -> Any:
        """A TCPStore hosted by rank 0, its address broadcast over MPI.

        Side groups on other backends (``new_group(backend="tcp")``) and the nccl/gloo
        rendezvous need a Store every rank shares, even under plain mpiexec. mpiexec's
        world is now procgroup's: an uncaught exception aborts the job (:mod:`._abort`).
        """
        from procgroup.rendezvous import HashStore, TCPStore

        _initialized()
        if size == 1:
            return HashStore()
        if _abort.wanted():
            _abort.install(MPI.COMM_WORLD)
        # rank 0 makes the job key ($PROCGROUP_JOB_TOKEN's when set, else a random one) and
        # sends it with the address over MPI, whose own channel is trusted: only this job's
        # ranks can then pass the store's handshake
        key = b""
        store = None
        if rank == 0:
            key = job_key(os.environ.get("PROCGROUP_JOB_TOKEN") or os.urandom(24).hex())
            address = choose_address(None)
            store = TCPStore(address, 0, is_master=True, timeout=timeout, job_key=key)
        # key (32 bytes) + "host port" in a fixed-size buffer, broadcast nonblocking so a
        # rank 0 that failed above is a timeout on the others, not a hang
        buf = bytearray(_KEY_BYTES + _ADDRESS_BYTES)
        if store is not None:
            text = f"{address} {store.port}".encode()
            buf[:_KEY_BYTES] = key
            buf[_KEY_BYTES:_KEY_BYTES + len(text)] = text
        req = MPI.COMM_WORLD.Ibcast([buf, _BYTE], root=0)
        wait_all([req], timeout, f"broadcast of the Store address from rank 0 (rank {rank} waited)",
                 "init_process_group", keep=buf)
        if store is not None:
            return store
        key = bytes(buf[:_KEY_BYTES])
        host, port = bytes(buf[_KEY_BYTES:]).rstrip(b"\0").decode().rsplit(" ", 1)
        return TCPStore(host, int(port), timeout=timeout, job_key=key)

    def __init__(self, ctx: ChannelContext, comm: Any = None) -> None:
        _initialized()
        super().__init__(ctx)
        self._routes = TagRoutes(comm if comm is not None else world_comm(ctx), ctx)
        self._comm = self._routes.comm
        self._route = self._routes.route
        self._iallreduce = self._comm.Iallreduce
        # user tags 0..mask need no routing: their Isend/Irecv are bound once, as they are
        # on every message's path (after close() they fail on the freed communicator)
        self._mask = self._routes.mask
        self._isend = self._comm.Isend
        self._irecv = self._comm.Irecv
        if _cuda.cuda_aware(ctx.options):
            self.devices = ("cpu", "cuda")
        log.debug("mpi channel rank %d of %d (group %d), tag mask %#x, %d user tag communicators",
                  ctx.rank, ctx.size, ctx.group_id, self._routes.mask, self._routes.n_tag_comms)

    # ------------------------------------------------------------------ helpers
    def others(self) -> list[int]:
        """World ranks of the other members: whom a stuck collective waits on."""
        return [self.ctx.global_rank(r) for r in range(self.size) if r != self.rank]

    def _refused(self, exc: Exception, op: str) -> BaseException:
        """The error for an MPI call that raised; the communicators of a closed channel
        are freed, so that is where a call after close() ends up."""
        self.check_usable()
        return translate(exc, op)

    def _averaging(self, work: MpiWork, array: Any) -> MpiWork:
        """AVG is MPI's SUM, then one division by the group size once the SUM is done."""
        return work.then(functools.partial(finish_average, _AVG, array, self.size)) if self.size > 1 else work

    # ------------------------------------------------------------------ point to point
    # Messages travel as bytes (MPI_BYTE, the count is the array's nbytes) on both sides:
    # the core lets only native numeric dtypes through, and a receive then compares byte
    # counts, so a send needs no datatype lookup.
    def _isend_routed(self, array: Any, dst: int, tag: int) -> Any:
        if tag <= self._mask:
            return self._isend((array, _BYTE), dst, tag)
        comm, mtag = self._route(tag)
        return comm.Isend((array, _BYTE), dst, mtag)

    def _irecv_routed(self, array: Any, src: int | None, tag: int) -> Any:
        source = _ANY_SOURCE if src is None else src
        if tag <= self._mask:
            return self._irecv((array, _BYTE), source, tag)
        comm, mtag = self._route(tag)
        return comm.Irecv((array, _BYTE), source, mtag)

    def start_send(self, array: Any, dst: int, tag: int = 0) -> MpiWork:
        try:
            req = self._isend_routed(array, dst, tag)
        except MPI.Exception as exc:
            raise self._refused(exc, "send") from None
        return SendWork(self, req, array, dst, tag)

    def start_recv(self, array: Any, src: int | None = None, tag: int = 0) -> MpiWork:
        try:
            req = self._irecv_routed(array, src, tag)
        except MPI.Exception as exc:
            raise self._refused(exc, "recv") from None
        return RecvWork(self, req, array, src, tag, _Status())

    # Blocking p2p, for small messages' latency: the MPI call, a bare spin on Test, and a
    # Work (timeout, cancel, errors) only when the spin did not see the request end. An
    # 8 B message's time is mostly interpreter steps, so this path takes as few as it can:
    # the unrouted tags' calls written out (not through _isend_routed), the first Test
    # called as a method (binding req.Test builds an object, worth it only for the spin).
    def do_send(self, array: Any, dst: int, tag: int = 0) -> None:
        try:
            if tag <= self._mask:
                req = self._isend((array, _BYTE), dst, tag)
            else:
                comm, mtag = self._route(tag)
                req = comm.Isend((array, _BYTE), dst, mtag)
        except MPI.Exception as exc:
            raise self._refused(exc, "send") from None
        try:
            if req.Test():
                return
            test = req.Test
            for _ in SPIN:
                if test():
                    return
        except MPI.Exception as exc:
            raise translate(exc, "send") from None
        except BaseException:  # Ctrl-C while spinning: the Work keeps the request safe
            SendWork(self, req, array, dst, tag)._abandon()
            raise
        SendWork(self, req, array, dst, tag).wait()

    def do_recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        status = _Status()
        try:
            if tag <= self._mask:
                req = self._irecv((array, _BYTE), _ANY_SOURCE if src is None else src, tag)
            else:
                comm, mtag = self._route(tag)
                req = comm.Irecv((array, _BYTE), _ANY_SOURCE if src is None else src, mtag)
        except MPI.Exception as exc:
            raise self._refused(exc, "recv") from None
        try:
            done = req.Test(status)
            if not done:
                test = req.Test
                for _ in SPIN:
                    if test(status):
                        done = True
                        break
        except MPI.Exception as exc:
            raise translate(exc, "recv") from None
        except BaseException:  # Ctrl-C while spinning: cancel the receive (or let it land)
            RecvWork(self, req, array, src, tag, status)._abandon()
            raise
        if not done:
            work = RecvWork(self, req, array, src, tag, status)
            work.wait()
            return int(work.result())
        got = status.Get_count()
        try:
            short = got != array.nbytes
        except AttributeError:  # a device array that only has __cuda_array_interface__
            short = got != nbytes(array)
        if short:
            raise size_error(self, status, got, array)
        return status.Get_source() if src is None else src

    # ------------------------------------------------------------------ collectives
    def start_all_reduce(self, array: Any, op: ReduceOp) -> MpiWork:
        plan = PLANS.get((op, array.dtype)) or reduce_plan(op, array.dtype)
        try:
            req = self._iallreduce(_IN_PLACE, [array, plan[0]], plan[1])
        except MPI.Exception as exc:
            raise self._refused(exc, "all_reduce") from None
        work = MpiWork(self, "all_reduce", req, array)
        return self._averaging(work, array) if plan[2] else work

    def do_all_reduce(self, array: Any, op: ReduceOp) -> None:
        """The blocking form, for small all_reduces' latency: start_all_reduce's MPI call,
        then a Work (its timeout, parking, errors) only when the spin did not see it end.
        start + wait costs more per call (docs/backends/mpi.md has the figures)."""
        plan = PLANS.get((op, array.dtype)) or reduce_plan(op, array.dtype)
        try:
            req = self._iallreduce(_IN_PLACE, [array, plan[0]], plan[1])
        except MPI.Exception as exc:
            raise self._refused(exc, "all_reduce") from None
        try:
            done = req.Test()
            if not done:
                test = req.Test
                for _ in SPIN:
                    if test():
                        done = True
                        break
        except MPI.Exception as exc:
            raise translate(exc, "all_reduce") from None
        except BaseException:  # Ctrl-C while spinning: MPI may still write into array
            park([req], array)
            raise
        if not done:
            MpiWork(self, "all_reduce", req, array).wait()
        if plan[2] and self.size > 1:
            finish_average(_AVG, array, self.size)

    def start_broadcast(self, array: Any, src: int) -> MpiWork:
        try:
            req = self._comm.Ibcast([array, datatype_of(array.dtype)], src)
        except MPI.Exception as exc:
            raise self._refused(exc, "broadcast") from None
        return MpiWork(self, "broadcast", req, array)

    def start_reduce(self, array: Any, dst: int, op: ReduceOp) -> MpiWork:
        plan = reduce_plan(op, array.dtype, "reduce")
        spec = [array, plan.datatype]
        root = self.rank == dst
        try:
            if root:
                req = self._comm.Ireduce(_IN_PLACE, spec, plan.op, dst)
            else:
                req = self._comm.Ireduce(spec, None, plan.op, dst)
        except MPI.Exception as exc:
            raise self._refused(exc, "reduce") from None
        work = MpiWork(self, "reduce", req, array)
        return self._averaging(work, array) if plan.divide and root else work

    def start_all_gather(self, output_list: Sequence[Any], array: Any) -> MpiWork:
        try:
            req = self._comm.Iallgatherv([array, _BYTE], spread(output_list, readonly=False))
        except MPI.Exception as exc:
            raise self._refused(exc, "all_gather") from None
        return MpiWork(self, "all_gather", req, (output_list, array))

    def start_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> MpiWork:
        recv = spread(gather_list, readonly=False) if gather_list is not None and self.rank == dst else None
        try:
            req = self._comm.Igatherv([array, _BYTE], recv, dst)
        except MPI.Exception as exc:
            raise self._refused(exc, "gather") from None
        return MpiWork(self, "gather", req, (array, gather_list))

    def start_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> MpiWork:
        send = spread(scatter_list, readonly=True) if scatter_list is not None and self.rank == src else None
        try:
            req = self._comm.Iscatterv(send, [array, _BYTE], src)
        except MPI.Exception as exc:
            raise self._refused(exc, "scatter") from None
        return MpiWork(self, "scatter", req, (array, scatter_list))

    def start_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> MpiWork:
        plan = reduce_plan(op, output.dtype, "reduce_scatter")
        # MPI_Reduce_scatter takes one contiguous send buffer: the one copy of this
        # backend, only when input_list is not already views of one buffer
        source = span(input_list)
        if source is None:
            source = concatenate(input_list)
        try:
            req = self._comm.Ireduce_scatter_block([source, plan.datatype], [output, plan.datatype], plan.op)
        except MPI.Exception as exc:
            raise self._refused(exc, "reduce_scatter") from None
        # keep: the send buffer (a 16 MiB concatenation, say) lives until MPI is done with
        # it; a freed buffer is reused by the next allocation while MPI still reads it
        work = MpiWork(self, "reduce_scatter", req, (output, input_list, source))
        return self._averaging(work, output) if plan.divide else work

    def start_all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> MpiWork:
        try:
            req = self._comm.Ialltoallv(spread(input_list, readonly=True), spread(output_list, readonly=False))
        except MPI.Exception as exc:
            raise self._refused(exc, "all_to_all") from None
        return MpiWork(self, "all_to_all", req, (output_list, input_list))

    def start_barrier(self) -> MpiWork:
        try:
            req = self._comm.Ibarrier()
        except MPI.Exception as exc:
            raise self._refused(exc, "barrier") from None
        return MpiWork(self, "barrier", req, None)

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> MpiChannel:
        """A channel over ``MPI_Comm_create_group`` of the members (only they call it)."""
        self.check_usable()
        comm = create_group(self._comm, list(ranks), ctx, ctx.group_id & self._routes.mask)
        return type(self)(ctx, comm=comm)

    # ------------------------------------------------------------------ teardown
    def do_close(self) -> None:
        """Free the communicators (pending requests stay with MPI); the world channel
        also puts back the excepthook that discover_store installed."""
        if self.ctx.group_id == 0:
            _abort.uninstall()
        if not MPI.Is_finalized():
            self._routes.free()


__all__ = ["MpiChannel"]
