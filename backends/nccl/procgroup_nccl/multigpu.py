"""The seed's multi-GPU collectives: one process drives several GPUs of one group.

Each process passes a list with one array per GPU it drives (every process the same
number, ``ndev``); NCCL sees ``world_size * ndev`` ranks, the array ``i`` of process
``p`` being NCCL rank ``p * ndev + i``. The calls are grouped (ncclGroupStart/End), so
one thread feeds every GPU without deadlock. The group must use backend "nccl".
The plugin publishes these as ``procgroup.<name>`` (BackendSpec.api).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import procgroup
from procgroup import arrays
from procgroup.backend import Work
from procgroup.errors import (
    InvalidArgumentError,
    InvalidArrayError,
    UnsupportedOperationError,
)
from procgroup.ops import ReduceOp, check_op_dtype

from ._buffers import DeviceBuffer, device_buffer


def _channel(group: Any, op: str) -> Any:
    """The NcclChannel of ``group``; a clear error for any other backend."""
    from .channel import NcclChannel

    channel = procgroup.group_channel(group, op)
    if not isinstance(channel, NcclChannel):
        raise UnsupportedOperationError(
            f"{op}: needs a group of backend 'nccl'; this group's backend is {channel.backend_name!r}"
        )
    return channel


def _count(items: Any, name: str, op: str) -> int:
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidArgumentError(f"{op}: {name} must be a non-empty list of CUDA arrays, one per GPU")
    return len(items)


def _buffers(items: Any, name: str, op: str, *, writable: bool) -> list[DeviceBuffer]:
    _count(items, name, op)
    bufs = []
    for i, a in enumerate(items):
        label = f"{name}[{i}]"
        if arrays.device_of(a) != arrays.CUDA:
            raise UnsupportedOperationError(
                f"{op}: backend 'nccl' moves CUDA arrays only, but {label} is in host memory; "
                f"move it to its GPU (cupy.asarray(...))"
            )
        if writable and arrays.cuda_info(a, name=label).read_only:
            raise InvalidArrayError(f"{op}: {label} is read-only, but this op writes its result into it")
        bufs.append(device_buffer(a, label))
    first = bufs[0]
    for i, b in enumerate(bufs):
        if b.dtype != first.dtype or b.size != first.size:
            raise InvalidArrayError(
                f"{op}: {name}[{i}] has dtype {b.dtype} and {b.size} elements, but {name}[0] has "
                f"dtype {first.dtype} and {first.size}; they must match"
            )
    return bufs


def _index(value: int, ndev: int, what: str, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < ndev:
        raise InvalidArgumentError(f"{op}: {what} must be an int in [0, {ndev}), got {value!r}")
    return value


def _finish(work: Work, async_op: bool) -> Work | None:
    """The Work for async_op=True; else wait for it, as every blocking nccl call does."""
    if async_op:
        return work
    work.wait()
    return None


def broadcast_multigpu(tensor_list: Sequence[Any], src: int, group: Any = None, async_op: bool = False,
                       src_tensor: int = 0) -> Work | None:
    """Every array of every process gets ``tensor_list[src_tensor]`` of world rank ``src``."""
    op = "broadcast_multigpu"
    channel = _channel(group, op)
    root = channel.ctx.channel_rank(src, "src")
    idx = _index(src_tensor, _count(tensor_list, "tensor_list", op), "src_tensor", op)
    bufs = _buffers(tensor_list, "tensor_list", op, writable=True)
    return _finish(channel.start_broadcast_multigpu(bufs, root * len(bufs) + idx), async_op)


def all_reduce_multigpu(tensor_list: Sequence[Any], op: ReduceOp = ReduceOp.SUM, group: Any = None,
                        async_op: bool = False) -> Work | None:
    """Reduce all arrays of all processes with ``op``; every array gets the result."""
    name = "all_reduce_multigpu"
    channel = _channel(group, name)
    bufs = _buffers(tensor_list, "tensor_list", name, writable=True)
    check_op_dtype(op, bufs[0].dtype)
    return _finish(channel.start_all_reduce_multigpu(bufs, op), async_op)


def reduce_multigpu(tensor_list: Sequence[Any], dst: int, op: ReduceOp = ReduceOp.SUM, group: Any = None,
                    async_op: bool = False, dst_tensor: int = 0) -> Work | None:
    """Reduce all arrays into ``tensor_list[dst_tensor]`` of world rank ``dst``."""
    name = "reduce_multigpu"
    channel = _channel(group, name)
    root = channel.ctx.channel_rank(dst, "dst")
    idx = _index(dst_tensor, _count(tensor_list, "tensor_list", name), "dst_tensor", name)
    bufs = _buffers(tensor_list, "tensor_list", name, writable=channel.rank == root)
    check_op_dtype(op, bufs[0].dtype)
    return _finish(channel.start_reduce_multigpu(bufs, root * len(bufs) + idx, op), async_op)


def all_gather_multigpu(output_tensor_lists: Sequence[Sequence[Any]], input_tensor_list: Sequence[Any],
                        group: Any = None, async_op: bool = False) -> Work | None:
    """``output_tensor_lists[i][k]`` (on the GPU of input i) gets NCCL rank k's input."""
    name = "all_gather_multigpu"
    channel = _channel(group, name)
    bufs = _buffers(input_tensor_list, "input_tensor_list", name, writable=False)
    if not isinstance(output_tensor_lists, (list, tuple)) or len(output_tensor_lists) != len(bufs):
        raise InvalidArgumentError(
            f"{name}: output_tensor_lists must hold one list per input array ({len(bufs)})"
        )
    total = channel.size * len(bufs)
    out_lists = []
    for i, outs in enumerate(output_tensor_lists):
        label = f"output_tensor_lists[{i}]"
        if not isinstance(outs, (list, tuple)) or len(outs) != total:
            raise InvalidArgumentError(
                f"{name}: {label} must be a list of world_size * len(input_tensor_list) = {total} arrays"
            )
        out_bufs = _buffers(outs, label, name, writable=True)
        if out_bufs[0].dtype != bufs[0].dtype or out_bufs[0].size != bufs[0].size:
            raise InvalidArrayError(f"{name}: the arrays of {label} must match input_tensor_list[{i}] in dtype and size")
        if any(o.device != bufs[i].device for o in out_bufs):
            raise InvalidArrayError(f"{name}: the arrays of {label} must be on the GPU of input_tensor_list[{i}]")
        out_lists.append(out_bufs)
    return _finish(channel.start_all_gather_multigpu(out_lists, bufs), async_op)


__all__ = ["all_gather_multigpu", "all_reduce_multigpu", "broadcast_multigpu", "reduce_multigpu"]
