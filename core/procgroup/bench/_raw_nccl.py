"""GPU sweeps: CuPy buffers on each rank's GPU, and ``raw-nccl`` (``--compare raw``).

A sweep that measures the nccl backend (``-B nccl``) runs on CuPy arrays on GPU
``rank % device count``, for every variant. Every timed call then ends with a synchronize
of the caller's stream: a blocking nccl call returns once the op is ordered on that
stream (as torch's does), and the time must include the op. ``raw-nccl`` makes the same
NCCL calls straight on a ``cupy.cuda.nccl.NcclCommunicator`` of its own, without
procgroup, on the same buffers; its unique id travels over the control group.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from ._sweep import Buffers
from ._variants import Call, Variant, pingpong_call

_NCCL_TYPES = {"float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "int32": "NCCL_INT32", "int64": "NCCL_INT64"}


def use_gpu(rank: int) -> Any:
    """Put this rank on GPU ``rank % count``; returns the cupy module (the buffers' array module)."""
    import cupy

    cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
    return cupy


def synced(call: Call) -> Call:
    """``call`` followed by a synchronize of the current stream (the op done on the GPU)."""
    import cupy

    def run() -> None:
        call()
        cupy.cuda.get_current_stream().synchronize()

    return run


def nccl_missing() -> str | None:
    """Why raw NCCL cannot run here (None when it can)."""
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not importable (pip install 'procgroup-nccl[cuda12]' or '[cuda13]')"
    from cupy.cuda import nccl

    if not getattr(nccl, "available", True):
        return "the NCCL library (libnccl.so.2) was not found"
    return None


class RawNcclVariant(Variant):
    """NCCL calls on a communicator of every rank, made with CuPy's wrapper only."""

    label = "raw-nccl"

    def __init__(self, rank: int, world_size: int, share: Callable[[Any], Any]) -> None:
        import cupy
        from cupy.cuda import nccl

        self._nccl = nccl
        uid = share(nccl.get_unique_id() if rank == 0 else None)
        self._comm = nccl.NcclCommunicator(world_size, uid, rank)
        self._stream = cupy.cuda.get_current_stream()
        self._one = cupy.zeros(1, cupy.float32)

    def prepare(self, op: str, b: Buffers, rank: int, world_size: int) -> Call:
        nccl, comm, sp = self._nccl, self._comm, self._stream.ptr
        dt = getattr(nccl, _NCCL_TYPES[b.send.dtype.name])
        dev: Any = b  # under -B nccl the Buffers hold cupy arrays: `.data.ptr` is a device pointer
        send, recv, s = dev.send.data.ptr, dev.recv.data.ptr, nccl.NCCL_SUM
        if op == "all_reduce":
            return lambda: comm.allReduce(recv, recv, b.recv.size, dt, s, sp)
        if op == "broadcast":
            return lambda: comm.bcast(recv, b.recv.size, dt, 0, sp)
        if op == "reduce":
            return lambda: comm.reduce(recv, recv, b.recv.size, dt, s, 0, sp)
        if op == "all_gather":
            return lambda: comm.allGather(send, recv, b.send.size, dt, sp)  # count per rank
        if op == "reduce_scatter":
            return lambda: comm.reduceScatter(send, recv, b.recv.size, dt, s, sp)
        if op == "pingpong":
            n = b.recv.size
            return pingpong_call(rank, lambda peer: comm.send(send, n, dt, peer, sp),
                                 lambda peer: comm.recv(recv, n, dt, peer, sp))
        raise ValueError(op)

    def unsupported(self, op: str) -> str | None:
        return "NCCL has no all_to_all call" if op == "all_to_all" else None

    def barrier(self) -> None:
        p = self._one.data.ptr
        self._comm.allReduce(p, p, 1, self._nccl.NCCL_FLOAT32, self._nccl.NCCL_SUM, self._stream.ptr)
        self._stream.synchronize()

    def close(self) -> None:
        self._comm.destroy()


__all__ = ["RawNcclVariant", "nccl_missing", "synced", "use_gpu"]
