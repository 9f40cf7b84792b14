"""torch's single-tensor collectives, built on the list collectives every backend has.

``all_gather_into_tensor``, ``reduce_scatter_tensor`` and ``all_to_all_single`` view the
caller's one tensor as ``group size`` equal flat pieces (no copy) and run all_gather,
reduce_scatter or all_to_all on them, so a backend's native list collective serves them.
``all_to_all_single`` with uneven split sizes pads every piece to the largest split any
rank uses (one small all_reduce finds it), so it too runs as one all_to_all; the pieces
are copied in and out of the padded buffers in host memory.
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from . import _ops, arrays
from ._state import devices
from ._torch_args import member_or_none, torch_names
from ._torch_tensors import is_tensor
from .backend import CompletedWork, MappedWork, Work
from .errors import InvalidArgumentError
from .groups import Group
from .ops import ReduceOp


class _Flat:
    """One flat view of a whole tensor (no copy), staged through host memory when it is a
    CUDA array and the backend moves host arrays only, or when ``host`` is asked for."""

    def __init__(self, g: Group, x: Any, name: str, *, writable: bool, reads: bool, host: bool = False) -> None:
        self.original, self.name, self.writable = x, name, writable
        self.staged: np.ndarray | None = None
        device = arrays.device_of(x)
        if device == arrays.CPU:
            self.array: Any = arrays.as_host_array(x, name=name, writable=writable)
        elif arrays.CUDA in devices(g) and not host:
            self.array = x.detach() if is_tensor(x) else x
            arrays.cuda_info(self.array, name=name)  # rejects non-contiguous device arrays
        else:
            self.staged = arrays.stage_to_host(x, name=name, writable=writable, copy=reads)
            self.array = self.staged
        self.flat = self.array.reshape(-1)
        self.shape = tuple(int(s) for s in self.array.shape)

    def pieces(self, n: int, op: str) -> list[Any]:
        size = int(self.flat.shape[0])
        if size % n:
            raise InvalidArgumentError(f"{op}: {self.name} has {size} elements, which do not split into "
                                       f"{n} equal pieces (one per rank)")
        k = size // n
        return [self.flat[i * k:(i + 1) * k] for i in range(n)]

    def finish(self) -> None:
        """Copy a staged result back into the caller's device array."""
        if self.staged is not None and self.writable:
            arrays.copy_back(self.staged, self.original)


def _then(work: Work | None, finish: Callable[[], None], async_op: bool) -> Work | None:
    if async_op and work is not None:
        return MappedWork(work, then=finish)
    finish()
    return work


@torch_names()
def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False) -> Work | None:
    """output_tensor (group size x input's elements, stacked or concatenated) receives every
    member's input_tensor, in rank order."""
    g = member_or_none(group, "all_gather_into_tensor")
    if g is None:
        return None
    out = _Flat(g, output_tensor, "output_tensor", writable=True, reads=False)
    inp = _Flat(g, input_tensor, "input_tensor", writable=False, reads=True)
    work = _ops.all_gather(out.pieces(g.size, "all_gather_into_tensor"), inp.array, group=g, async_op=async_op)
    return _then(work, out.finish, async_op)


@torch_names()
def reduce_scatter_tensor(output: Any, input: Any, op: ReduceOp = ReduceOp.SUM, group: Any = None,
                          async_op: bool = False) -> Work | None:
    """output = op over members of piece ``my rank`` of their input (group size x output)."""
    g = member_or_none(group, "reduce_scatter_tensor")
    if g is None:
        return None
    out = _Flat(g, output, "output", writable=True, reads=False)
    inp = _Flat(g, input, "input", writable=False, reads=True)
    work = _ops.reduce_scatter(out.array, inp.pieces(g.size, "reduce_scatter_tensor"), op, group=g,
                               async_op=async_op)
    return _then(work, out.finish, async_op)


@torch_names()
def all_to_all_single(output: Any, input: Any, output_split_sizes: Sequence[int] | None = None,
                      input_split_sizes: Sequence[int] | None = None, group: Any = None,
                      async_op: bool = False) -> Work | None:
    """Split input along its first dimension (equal pieces, or ``input_split_sizes`` rows),
    send piece j to member j, and concatenate what arrives into output (``output_split_sizes``
    rows from each member, in rank order)."""
    g = member_or_none(group, "all_to_all_single")
    if g is None:
        return None
    if output_split_sizes is None and input_split_sizes is None:
        out = _Flat(g, output, "output", writable=True, reads=False)
        inp = _Flat(g, input, "input", writable=False, reads=True)
        work = _ops.all_to_all(out.pieces(g.size, "all_to_all_single"), inp.pieces(g.size, "all_to_all_single"),
                               group=g, async_op=async_op)
        return _then(work, out.finish, async_op)
    _uneven(g, output, input, output_split_sizes, input_split_sizes)
    return CompletedWork("all_to_all_single") if async_op else None


def _splits(sizes: Sequence[int] | None, rows: int, n: int, name: str) -> list[int]:
    """Split sizes (rows per member) as torch takes them: None is an equal split."""
    if sizes is None:
        if rows % n:
            raise InvalidArgumentError(f"all_to_all_single: {name} is None, but the tensor's {rows} rows do not "
                                       f"split equally over {n} ranks")
        return [rows // n] * n
    out = list(sizes)
    if len(out) != n or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in out):
        raise InvalidArgumentError(f"all_to_all_single: {name} must be {n} non-negative ints (one per rank), "
                                   f"got {sizes!r}")
    if sum(out) != rows:
        raise InvalidArgumentError(f"all_to_all_single: {name} {out} add up to {sum(out)} rows, but the tensor "
                                   f"has {rows}")
    return out


def _uneven(g: Group, output: Any, input: Any, out_sizes: Sequence[int] | None,
            in_sizes: Sequence[int] | None) -> None:
    out = _Flat(g, output, "output", writable=True, reads=False, host=True)
    inp = _Flat(g, input, "input", writable=False, reads=True, host=True)
    if not out.shape or not inp.shape or out.shape[1:] != inp.shape[1:] or out.array.dtype != inp.array.dtype:
        raise InvalidArgumentError(f"all_to_all_single: output {out.shape} {out.array.dtype} and input {inp.shape} "
                                   f"{inp.array.dtype} must have the same dtype and the same shape after dim 0")
    row = math.prod(inp.shape[1:])
    sends = _splits(in_sizes, inp.shape[0], g.size, "input_split_sizes")
    takes = _splits(out_sizes, out.shape[0], g.size, "output_split_sizes")
    longest = np.array([max(sends + takes)], dtype=np.int64)
    _ops.all_reduce(longest, ReduceOp.MAX, group=g)
    width = int(longest[0]) * row
    send_pad = np.zeros((g.size, width), dtype=inp.array.dtype)
    recv_pad = np.empty((g.size, width), dtype=inp.array.dtype)
    offset = 0
    for j, rows in enumerate(sends):
        send_pad[j, :rows * row] = inp.flat[offset:offset + rows * row]
        offset += rows * row
    _ops.all_to_all(list(recv_pad), list(send_pad), group=g)
    offset = 0
    for j, rows in enumerate(takes):
        out.flat[offset:offset + rows * row] = recv_pad[j, :rows * row]
        offset += rows * row
    out.finish()


__all__ = ["all_gather_into_tensor", "all_to_all_single", "reduce_scatter_tensor"]
