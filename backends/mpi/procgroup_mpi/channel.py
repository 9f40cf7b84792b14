"""MpiChannel: procgroup's DataChannel over MPI, one communicator per group.

Every op is the native nonblocking MPI call on the caller's buffer (no copies), then a
poll with the channel's timeout (:mod:`._wait`), so nothing blocks forever:
Isend/Irecv, Ibcast, Iallreduce (``IN_PLACE``), Ireduce (``IN_PLACE`` at the root),
Iallgatherv/Igatherv/Iscatterv/Ialltoallv (the ``v`` forms take the caller's list of
separate arrays as byte displacements from the lowest address: zero copies, and every
rank calls the same MPI collective whatever its own memory layout),
Ireduce_scatter_block, Ibarrier. ``async_op=True`` returns the same requests as a Work.

Communicators. The world channel duplicates ``COMM_WORLD``; ``new_group`` makes
``Comm.Create_group`` over the members. Each channel owns:

- ``comm``: native collectives and user tags ``0..mask`` (``mask`` is the largest
  ``2**k - 1 <= MPI_TAG_UB``; MPICH: 2**29 - 1, Open MPI: 2**31 - 1);
- extra duplicates for the user tags above ``mask`` (tag ``t`` -> communicator
  ``t >> k``, tag ``t & mask``) so that all of ``[0, 2**31)`` is distinct; at most
  :data:`MAX_TAG_COMMS` of them, beyond that (an MPI with a tiny TAG_UB) tags fold;
- ``coll``: point-to-point traffic in procgroup's collective tag space (tags
  ``>= 2**40`` from the default algorithms) as tag ``(t - 2**40) & mask``; the
  sequence numbers only wrap after ``mask + 1`` collectives, long after they matched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI
from procgroup.channel import (
    COLLECTIVE_TAG_BASE,
    ChannelContext,
    DataChannel,
    Work,
)
from procgroup.errors import (
    ChannelClosedError,
    CommTimeoutError,
    InvalidArgumentError,
    InvalidArrayError,
    ProcGroupError,
)
from procgroup.ops import ReduceOp, finish_average

from . import _abort, _cuda
from ._types import _REDUCE_ARGS, datatype_of, op_for, reduce_args
from ._wait import MpiWork, cancel_recv, park, translate, wait_requests

log = logging.getLogger(__name__)

#: At most this many communicators carry user tags (see the module docstring).
MAX_TAG_COMMS = 8
_USER_TAG_LIMIT = 2**31
_fromaddress = MPI.buffer.fromaddress
_IN_PLACE = MPI.IN_PLACE
_BYTE = MPI.BYTE
_AVG = ReduceOp.AVG
_ADDRESS_BYTES = 512
#: Test calls all_reduce makes before the timed poll of _wait (about 0.1-0.2 ms).
_SPIN_TESTS = range(1000)


def _address(array: Any) -> int:
    """The first byte of a (host or device) C-contiguous array."""
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return int(array.__cuda_array_interface__["data"][0])


def _nbytes(array: Any) -> int:
    return int(array.nbytes) if hasattr(array, "nbytes") else int(np.prod(array.shape)) * np.dtype(array.dtype).itemsize


def _spread(arrays: Sequence[Any], readonly: bool) -> list[Any]:
    """One MPI ``v`` buffer over separate arrays: bytes from the lowest address, no copy."""
    addrs = [_address(a) for a in arrays]
    sizes = [_nbytes(a) for a in arrays]
    base = min(addrs)
    span = max(a + n for a, n in zip(addrs, sizes)) - base
    buf = _fromaddress(base, span, readonly=readonly)
    return [buf, (sizes, [a - base for a in addrs]), _BYTE]


def _tag_ub() -> int:
    """MPI_TAG_UB, an attribute of COMM_WORLD (at least 32767 by the standard)."""
    value = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    return int(value) if isinstance(value, int) else 32767


def _is_adjacent(arrays: Sequence[Any]) -> bool:
    """True when the arrays lie back to back in order (views of one buffer)."""
    addr = _address(arrays[0])
    for a in arrays:
        if _address(a) != addr:
            return False
        addr += _nbytes(a)
    return True


def _members_arrived(ctx: ChannelContext) -> None:
    """Return once every member reached the group's creation, else time out naming who did not.

    ``MPI_Comm_create_group`` blocks until all members call it and has no timeout; a
    member that never comes would hang the others. The members count their arrivals in
    the group's Store, and one ``compare_set`` settles the outcome for all: "go" once the
    count is complete, "abort" when a member's deadline passed first. A member arriving
    after an abort raises too, so no member enters the MPI call alone.
    """
    store = ctx.store
    store.set(f"mpi/arrived/{ctx.rank}", b"1")
    count = store.add("mpi/arrivals", 1)
    deadline = time.monotonic() + ctx.timeout
    nap = 0.001
    while count < ctx.size and time.monotonic() < deadline:
        time.sleep(min(nap, max(deadline - time.monotonic(), 0.0)))
        nap = min(nap * 2, 0.05)
        count = store.add("mpi/arrivals", 0)
    verdict = store.compare_set("mpi/verdict", "", "go" if count >= ctx.size else "abort")
    if verdict != b"go":
        missing = [ctx.global_rank(r) for r in range(ctx.size) if not store.check([f"mpi/arrived/{r}"])]
        who = f"rank(s) {missing} did not" if missing else "a member arrived after another had given up and did not"
        raise CommTimeoutError(
            f"new_group: {who} create the group within {ctx.timeout:g}s", op="new_group", ranks=missing,
        )


class MpiChannel(DataChannel):
    """The mpi backend's communicator; see the module docstring for the mapping."""

    backend_name = "mpi"
    native_order = True  # MPI runs a communicator's collectives in the order they were issued

    @classmethod
    def discover_world(cls) -> tuple[int, int]:
        """(rank, size) of ``COMM_WORLD``: mpiexec's answer, or a world of 1 without it."""
        world = MPI.COMM_WORLD
        return world.Get_rank(), world.Get_size()

    @classmethod
    def discover_store(cls, rank: int, size: int, timeout: float) -> Any:
        """A TCPStore hosted by rank 0, its address broadcast over MPI.

        Side groups on other backends (``new_group(backend="tcp")``) and the nccl/gloo
        rendezvous need a Store every rank shares, even under plain mpiexec.
        """
        from procgroup._netif import choose_address
        from procgroup.rendezvous import HashStore, TCPStore

        if size == 1:
            return HashStore()
        store = TCPStore("", 0, is_master=True, timeout=timeout) if rank == 0 else None
        # "host port" in a fixed-size buffer, broadcast nonblocking so a rank 0 that failed
        # above is a timeout on the others, not a hang
        buf = bytearray(_ADDRESS_BYTES)
        if store is not None:
            text = f"{choose_address(None)} {store.port}".encode()
            buf[:len(text)] = text
        req = MPI.COMM_WORLD.Ibcast([buf, _BYTE], root=0)
        try:
            wait_requests([req], timeout, f"broadcast of the Store address from rank 0 (rank {rank} waited)",
                          op="init_process_group")
        except BaseException:
            park([req], buf)  # the broadcast may still land in buf
            raise
        if store is not None:
            return store
        host, port = bytes(buf).rstrip(b"\0").decode().rsplit(" ", 1)
        return TCPStore(host, int(port), timeout=timeout)

    def __init__(self, ctx: ChannelContext, comm: Any = None) -> None:
        super().__init__(ctx)
        self._comm = comm if comm is not None else self._base_comm(ctx)
        self._iallreduce = self._comm.Iallreduce
        ub = _tag_ub()
        self._bits = (ub + 1).bit_length() - 1
        self._mask = (1 << self._bits) - 1
        n_tag_comms = min(MAX_TAG_COMMS, -(-_USER_TAG_LIMIT // (self._mask + 1)))
        dups = [self._comm.Idup() for _ in range(n_tag_comms)]  # extra user tag spaces + coll
        wait_requests([r for _, r in dups], ctx.timeout, f"communicator setup (rank {ctx.rank})")
        self._tag_comms = [self._comm] + [c for c, _ in dups[:-1]]
        self._coll = dups[-1][0]
        self._n_tag_comms = len(self._tag_comms)
        if _cuda.cuda_aware():
            self.devices = ("cpu", "cuda")
        self._aborting = False
        if ctx.group_id == 0 and MPI.COMM_WORLD.Get_size() > 1 and _abort.wanted():
            _abort.install(MPI.COMM_WORLD)
            self._aborting = True
        log.debug("mpi channel rank %d of %d (group %d), tag mask %#x, %d user tag communicators",
                  ctx.rank, ctx.size, ctx.group_id, self._mask, self._n_tag_comms)

    @staticmethod
    def _base_comm(ctx: ChannelContext) -> Any:
        """Duplicate COMM_WORLD, or make a communicator over ``ctx.global_ranks``.

        The rank and size the init method found must be MPI's: a mismatch (e.g. ranks
        started without mpiexec, each of them a world of 1) is an error, not a hang.
        """
        world = MPI.COMM_WORLD
        wrank, wsize = world.Get_rank(), world.Get_size()
        if ctx.size == wsize and ctx.rank == wrank:
            comm, req = world.Idup()
            wait_requests([req], ctx.timeout, "MPI_Comm_idup of COMM_WORLD")
            return comm
        members = list(ctx.global_ranks)
        if (ctx.group_id != 0 and len(members) == ctx.size and all(0 <= r < wsize for r in members)
                and members[ctx.rank] == wrank):
            _members_arrived(ctx)
            group = world.Get_group().Incl(members)
            try:
                return world.Create_group(group, tag=ctx.group_id % (_tag_ub() + 1))
            finally:
                group.Free()
        raise InvalidArgumentError(
            f"the mpi backend was given rank {ctx.rank} of a world of {ctx.size}, but MPI says this process "
            f"is rank {wrank} of {wsize}; start the job with 'mpiexec -n {ctx.size} python ...' and call "
            f"init_process_group('mpi') (no init_method needed)"
        )

    # ------------------------------------------------------------------ helpers
    def _route(self, tag: int) -> tuple[Any, int]:
        """(communicator, MPI tag) for a procgroup tag; see the module docstring."""
        if tag <= self._mask:
            return self._comm, tag
        if tag >= COLLECTIVE_TAG_BASE:
            return self._coll, (tag - COLLECTIVE_TAG_BASE) & self._mask
        return self._tag_comms[(tag >> self._bits) % self._n_tag_comms], tag & self._mask

    def _check(self) -> None:
        if self._closed:
            raise ChannelClosedError("the mpi channel is closed (destroy_process_group was called)")

    def _wait(self, requests: list[Any], what: str, keep: Any) -> None:
        try:
            wait_requests(requests, self.timeout, what)
        except BaseException:  # a timeout, or Ctrl-C: MPI may still use the buffers
            park(requests, keep)
            raise

    def _others(self) -> str:
        others = [self.ctx.global_rank(r) for r in range(self.size) if r != self.rank]
        return ", ".join(f"rank {r}" for r in others)

    def _run(self, op: str, requests: list[Any], finish: Any = None, keep: Any = None) -> None:
        """Wait for a collective's requests with the channel timeout, then ``finish``.

        ``keep`` (the op's arrays) and ``finish`` (which may hold a send buffer) outlive a
        timeout with the requests, so MPI never writes into memory that was freed.
        """
        try:
            wait_requests(requests, self.timeout, op)
        except BaseException as exc:  # a timeout, or Ctrl-C: MPI may still use the buffers
            park(requests, (keep, finish))
            if not isinstance(exc, CommTimeoutError):
                raise
            raise CommTimeoutError(
                f"{op} did not complete within {self.timeout:g}s: not every member joined it "
                f"(MPI cannot say which; waiting on {self._others()})",
                op=op, ranks=[self.ctx.global_rank(r) for r in range(self.size) if r != self.rank],
            ) from exc
        if finish is not None:
            finish()

    # ------------------------------------------------------------------ point to point
    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        self._check()
        comm, mtag = self._route(tag)
        try:
            req = comm.Isend([array, datatype_of(array)], dst, mtag)
        except MPI.Exception as exc:
            raise translate(exc, "send") from None
        self._wait([req], f"send to rank {self.ctx.global_rank(dst)} (tag {tag})", keep=array)

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        self._check()
        comm, mtag = self._route(tag)
        try:
            req = comm.Isend([array, datatype_of(array)], dst, mtag)
        except MPI.Exception as exc:
            raise translate(exc, "isend") from None
        return MpiWork("isend", [req], self.timeout, keep=array)

    def _irecv(self, array: Any, src: int | None, tag: int) -> tuple[Any, Any, Any]:
        self._check()
        comm, mtag = self._route(tag)
        dt = datatype_of(array)
        source = MPI.ANY_SOURCE if src is None else src
        try:
            req = comm.Irecv([array, dt], source, mtag)
        except MPI.Exception as exc:
            raise translate(exc, "recv") from None
        return req, dt, MPI.Status()

    def _check_count(self, status: Any, array: Any, dt: Any) -> None:
        got = status.Get_count(dt)
        want = int(np.prod(array.shape))
        if got != want:
            raise InvalidArrayError(
                f"message from rank {self.ctx.global_rank(status.Get_source())} has {got} elements of "
                f"{array.dtype.itemsize} bytes but the receive buffer has {want} (dtype {array.dtype}); "
                f"sizes must match"
            )

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        req, dt, status = self._irecv(array, src, tag)
        who = "any rank" if src is None else f"rank {self.ctx.global_rank(src)}"
        try:
            wait_requests([req], self.timeout, f"recv from {who} (tag {tag})", status)
        except CommTimeoutError as exc:
            if cancel_recv(req, status):
                ranks = [] if src is None else [self.ctx.global_rank(src)]
                raise CommTimeoutError(str(exc), op="recv", ranks=ranks) from None
        except ProcGroupError:  # an MPI error (truncation, ...): the receive is finished
            raise
        except BaseException:  # Ctrl-C: a receive left posted would swallow a later message
            cancel_recv(req, status)
            raise
        self._check_count(status, array, dt)
        return int(status.Get_source())

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        req, dt, status = self._irecv(array, src, tag)
        who = "any rank" if src is None else f"rank {self.ctx.global_rank(src)}"
        return MpiWork(f"irecv from {who} (tag {tag})", [req], self.timeout,
                       finish=lambda: self._check_count(status, array, dt), status=status, is_recv=True)

    # ------------------------------------------------------------------ collectives
    # Each _start_<op> issues the nonblocking MPI call and returns (requests, finish).
    def _start_broadcast(self, array: Any, src: int) -> tuple[list[Any], Any]:
        return [self._comm.Ibcast([array, datatype_of(array)], src)], None

    def _start_all_reduce(self, array: Any, op: ReduceOp) -> tuple[list[Any], Any]:
        req = self._comm.Iallreduce(_IN_PLACE, [array, datatype_of(array)], op_for(op, array))
        return [req], self._averager(array, op)

    def _start_reduce(self, array: Any, dst: int, op: ReduceOp) -> tuple[list[Any], Any]:
        spec = [array, datatype_of(array)]
        if self.rank == dst:
            return [self._comm.Ireduce(_IN_PLACE, spec, op_for(op, array), dst)], self._averager(array, op)
        return [self._comm.Ireduce(spec, None, op_for(op, array), dst)], None

    def _start_all_gather(self, output_list: Sequence[Any], array: Any) -> tuple[list[Any], Any]:
        return [self._comm.Iallgatherv([array, _BYTE], _spread(output_list, readonly=False))], None

    def _start_gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> tuple[list[Any], Any]:
        recv = _spread(gather_list, readonly=False) if gather_list is not None and self.rank == dst else None
        return [self._comm.Igatherv([array, _BYTE], recv, dst)], None

    def _start_scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> tuple[list[Any], Any]:
        send = _spread(scatter_list, readonly=True) if scatter_list is not None and self.rank == src else None
        return [self._comm.Iscatterv(send, [array, _BYTE], src)], None

    def _start_reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> tuple[list[Any], Any]:
        dt = datatype_of(output)
        if _is_adjacent(input_list):
            send = [_fromaddress(_address(input_list[0]), _nbytes(output) * self.size, readonly=True),
                    dt]
        else:
            # MPI_Reduce_scatter takes one contiguous send buffer: the one copy of this
            # backend, only when input_list is not already views of one buffer.
            send = [self._concatenate(input_list), dt]
        req = self._comm.Ireduce_scatter_block(send, [output, dt], op_for(op, output))
        average = self._averager(output, op)

        def finish() -> None:
            # holds the send buffer (a 16 MiB concatenation, say) until MPI is done with it:
            # a freed buffer is reused by the next allocation while MPI still reads it
            del send[:]
            if average is not None:
                average()

        return [req], finish

    def _concatenate(self, arrays: Sequence[Any]) -> Any:
        if all(isinstance(a, np.ndarray) for a in arrays):
            return np.concatenate([a.reshape(-1) for a in arrays])
        import cupy

        return cupy.concatenate([cupy.asarray(a).reshape(-1) for a in arrays])

    def _start_all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> tuple[list[Any], Any]:
        send = _spread(input_list, readonly=True)
        recv = _spread(output_list, readonly=False)
        return [self._comm.Ialltoallv(send, recv)], None

    def _start_barrier(self) -> tuple[list[Any], Any]:
        return [self._comm.Ibarrier()], None

    def _averager(self, array: Any, op: ReduceOp) -> Any:
        if op is not ReduceOp.AVG or self.size == 1:
            return None
        size = self.size
        return lambda: finish_average(op, array, size)

    def _start(self, op: str, args: tuple[Any, ...]) -> tuple[list[Any], Any]:
        self._check()
        try:
            return getattr(self, "_start_" + op)(*args)
        except MPI.Exception as exc:
            raise translate(exc, op) from None

    def _collective(self, op: str, args: tuple[Any, ...]) -> None:
        requests, finish = self._start(op, args)
        self._run(op, requests, finish, keep=args)

    def broadcast(self, array: Any, src: int) -> None:
        self._collective("broadcast", (array, src))

    def all_reduce(self, array: Any, op: ReduceOp) -> None:
        # the latency-critical op, inlined: one nonblocking call, then Test until done
        if self._closed:
            self._check()
        types = _REDUCE_ARGS.get((op, array.dtype)) or reduce_args(op, array)
        try:
            req = self._iallreduce(_IN_PLACE, [array, types[0]], types[1])
        except MPI.Exception as exc:
            raise translate(exc, "all_reduce") from None
        try:
            if not req.Test():
                test = req.Test
                for _ in _SPIN_TESTS:  # the bare poll loop first: a small op ends within it
                    if test():
                        break
                else:
                    self._run("all_reduce", [req], keep=array)
        except MPI.Exception as exc:
            raise translate(exc, "all_reduce") from None
        except BaseException:  # Ctrl-C while polling: MPI may still write into array
            park([req], array)
            raise
        if op is _AVG and self.size > 1:
            finish_average(op, array, self.size)

    def reduce(self, array: Any, dst: int, op: ReduceOp) -> None:
        self._collective("reduce", (array, dst, op))

    def all_gather(self, output_list: Sequence[Any], array: Any) -> None:
        self._collective("all_gather", (output_list, array))

    def gather(self, array: Any, gather_list: Sequence[Any] | None, dst: int) -> None:
        self._collective("gather", (array, gather_list, dst))

    def scatter(self, array: Any, scatter_list: Sequence[Any] | None, src: int) -> None:
        self._collective("scatter", (array, scatter_list, src))

    def reduce_scatter(self, output: Any, input_list: Sequence[Any], op: ReduceOp) -> None:
        self._collective("reduce_scatter", (output, input_list, op))

    def all_to_all(self, output_list: Sequence[Any], input_list: Sequence[Any]) -> None:
        self._collective("all_to_all", (output_list, input_list))

    def barrier(self) -> None:
        self._collective("barrier", ())

    def submit(self, op: str, *args: Any) -> Work:
        """The native nonblocking collective as a Work (MPI keeps collectives in issue order)."""
        requests, finish = self._start(op, args)
        return MpiWork(op, requests, self.timeout, finish=finish, keep=args)

    def run(self, op: str, *args: Any) -> None:
        """Blocking collectives need no queue: MPI orders them after earlier nonblocking ones."""
        getattr(self, op)(*args)

    # ------------------------------------------------------------------ groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> MpiChannel:
        """A channel over ``MPI_Comm_create_group`` of the members (only they call it)."""
        self._check()
        _members_arrived(ctx)
        group = self._comm.Get_group().Incl(list(ranks))
        try:
            comm = self._comm.Create_group(group, tag=ctx.group_id & self._mask)
        except MPI.Exception as exc:
            raise translate(exc, "new_group") from None
        finally:
            group.Free()
        return type(self)(ctx, comm=comm)

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Free the communicators (pending requests stay with MPI); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._aborting:
            _abort.uninstall()
        if MPI.Is_finalized():
            return
        for comm in [*self._tag_comms, self._coll]:
            try:
                comm.Free()
            except MPI.Exception:
                log.debug("freeing a communicator failed", exc_info=True)
        self.shutdown_threads()


__all__ = ["MAX_TAG_COMMS", "MpiChannel"]
