"""``--compare raw``: the same ops straight on mpi4py and pygloo, without procgroup.

These show what procgroup's own layers cost: ``raw-mpi4py`` calls the buffer-based
(upper-case) mpi4py methods on a duplicate of COMM_WORLD, ``raw-pygloo`` calls pygloo's
pointer-based functions on a gloo context of its own. Both use the sweep's NumPy buffers
directly (the data movement of each call is the same as procgroup's for that op).
"""

from __future__ import annotations

import datetime
import importlib.util
import logging
import os
import socket

from ._sweep import Buffers
from ._variants import Call, Variant, pingpong_call

log = logging.getLogger(__name__)

#: Environment variables that mean "started by an MPI launcher" (MPICH/PMI, Open MPI, PMIx).
MPI_LAUNCH_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def under_mpi_launcher() -> bool:
    return any(os.environ.get(v) for v in MPI_LAUNCH_VARS)


def mpi4py_missing() -> str | None:
    """Why raw mpi4py cannot run in this process (None when it can)."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not importable (pip install 'procgroup-mpi[mpich]' brings it and mpiexec)"
    if not under_mpi_launcher():
        return "this job was not started by mpiexec (procgroup-bench -np N does that when mpi4py is installed)"
    return None


def pygloo_missing() -> str | None:
    """Why raw pygloo cannot run here (None when it can)."""
    if importlib.util.find_spec("pygloo") is None:
        return "pygloo is not importable (wheels exist for CPython 3.8-3.10: run from .venv)"
    return None


class RawMpi4pyVariant(Variant):
    """mpi4py buffer methods on ``COMM_WORLD.Dup()``."""

    label = "raw-mpi4py"

    def __init__(self, rank: int, world_size: int) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        if (self._comm.Get_rank(), self._comm.Get_size()) != (rank, world_size):
            got = (self._comm.Get_rank(), self._comm.Get_size())
            self._comm.Free()
            raise RuntimeError(f"MPI says (rank, size) = {got} but the job has {(rank, world_size)}")

    def prepare(self, op: str, b: Buffers, rank: int, world_size: int) -> Call:
        comm, MPI = self._comm, self._mpi
        if op == "all_reduce":
            return lambda: comm.Allreduce(MPI.IN_PLACE, b.recv, op=MPI.SUM)
        if op == "broadcast":
            return lambda: comm.Bcast(b.recv, root=0)
        if op == "reduce":
            if rank == 0:
                return lambda: comm.Reduce(MPI.IN_PLACE, b.recv, op=MPI.SUM, root=0)
            return lambda: comm.Reduce(b.recv, None, op=MPI.SUM, root=0)
        if op == "all_gather":
            return lambda: comm.Allgather(b.send, b.recv)
        if op == "reduce_scatter":
            return lambda: comm.Reduce_scatter_block(b.send, b.recv, op=MPI.SUM)
        if op == "all_to_all":
            return lambda: comm.Alltoall(b.send, b.recv)
        if op == "pingpong":
            return pingpong_call(rank, lambda peer: comm.Send(b.send, peer), lambda peer: comm.Recv(b.recv, peer))
        raise ValueError(op)

    def barrier(self) -> None:
        self._comm.Barrier()

    def close(self) -> None:
        self._comm.Free()


_GLOO_TYPES = {"float32": "glooFloat32", "float64": "glooFloat64", "int32": "glooInt32", "int64": "glooInt64"}


class RawPyglooVariant(Variant):
    """pygloo functions on a full-mesh gloo context met through a FileStore in ``shared_dir``."""

    label = "raw-pygloo"

    def __init__(self, rank: int, world_size: int, host: str, shared_dir: str, timeout: float) -> None:
        import pygloo

        self._pygloo = pygloo
        ctx = pygloo.rendezvous.Context(rank, world_size)
        try:
            ctx.setTimeout(datetime.timedelta(seconds=timeout))
        except TypeError:  # pygloo 0.2 builds lack pybind11's chrono casters; gloo's default stays
            log.debug("pygloo cannot set a timeout; gloo's default (30 s) applies")
        address = host if host.startswith("127.") or host == "localhost" else socket.gethostname()
        # PrefixStore holds a C++ reference to the FileStore: keep both (and the device)
        # alive on self, or gloo reads freed memory.
        self._attr = pygloo.transport.tcp.attr(address)
        self._device = pygloo.transport.tcp.CreateDevice(self._attr)
        self._file_store = pygloo.rendezvous.FileStore(shared_dir)
        self._store = pygloo.rendezvous.PrefixStore(f"procgroup-bench-{world_size}", self._file_store)
        ctx.connectFullMesh(self._store, self._device)
        self._ctx = ctx

    def unsupported(self, op: str) -> str | None:
        if op == "all_to_all":
            return "pygloo has no all_to_all"
        return None

    def prepare(self, op: str, b: Buffers, rank: int, world_size: int) -> Call:
        pygloo, ctx = self._pygloo, self._ctx
        dt = getattr(pygloo.glooDataType_t, _GLOO_TYPES[b.send.dtype.name])
        send, recv = b.send.ctypes.data, b.recv.ctypes.data
        if op == "all_reduce":
            return lambda: pygloo.allreduce(ctx, recv, recv, b.recv.size, dt, pygloo.ReduceOp.SUM,
                                            pygloo.allreduceAlgorithm.RING)
        if op == "broadcast":
            return lambda: pygloo.broadcast(ctx, recv, recv, b.recv.size, dt, 0)
        if op == "reduce":
            return lambda: pygloo.reduce(ctx, recv, recv, b.recv.size, dt, pygloo.ReduceOp.SUM, 0)
        if op == "all_gather":
            return lambda: pygloo.allgather(ctx, send, recv, b.send.size, dt)  # count per rank
        if op == "reduce_scatter":
            elems = [b.recv.size] * world_size
            return lambda: pygloo.reduce_scatter(ctx, send, recv, b.send.size, elems, dt, pygloo.ReduceOp.SUM)
        if op == "pingpong":
            n = b.recv.size
            return pingpong_call(rank, lambda peer: pygloo.send(ctx, send, n, dt, peer),
                                 lambda peer: pygloo.recv(ctx, recv, n, dt, peer))
        raise ValueError(op)

    def barrier(self) -> None:
        self._pygloo.barrier(self._ctx)

    def close(self) -> None:
        self._ctx = None  # gloo closes its pairs when the context is freed


def dtype_supported_by_gloo(dtype_name: str) -> bool:
    return dtype_name in _GLOO_TYPES
