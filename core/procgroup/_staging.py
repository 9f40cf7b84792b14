"""Array staging: what a channel gets for the caller's arrays, and the copy back.

Arrays are validated here, before anything is sent. CUDA arrays given to a backend that
moves host memory only are staged through a host copy, and results are copied back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np

from . import _torch_tensors, arrays
from ._state import devices
from .errors import InvalidArgumentError, InvalidArrayError, UnsupportedOperationError
from .groups import Group


@dataclass
class Prepared:
    native: Any  # what the channel gets
    original: Any  # what the user passed
    staged: bool  # native is a host copy of a CUDA array
    dtype: np.dtype
    count: int  # elements


def prepare(g: Group, array: Any, name: str, op: str, *, writable: bool, reads: bool = True) -> Prepared:
    """What the channel gets for ``array``; ``reads=False``: the op only writes it, so a
    staged CUDA array needs no copy to the host first."""
    if type(array) is np.ndarray and arrays.CPU in g.spec.devices and array.flags.c_contiguous \
            and (array.flags.writeable or not writable) and array.dtype.kind in "biufc" \
            and array.dtype.isnative:
        return Prepared(array, array, False, array.dtype, array.size)  # the common case, fast
    if _torch_tensors.is_tensor(array):  # checked before anything is sent, whatever the device
        array = _torch_tensors.checked(array, name)
        if array.is_cpu and arrays.CPU in devices(g):
            host = _torch_tensors.numpy_view(array, name)
            return Prepared(host, array, False, host.dtype, host.size)
    device = arrays.device_of(array)
    takes = devices(g)
    if device == arrays.CUDA:
        if arrays.CUDA in takes:
            info = arrays.cuda_info(array, name=name)  # rejects non-contiguous arrays early
            if writable and info.read_only:
                raise InvalidArrayError(f"{name} is read-only, but {op} writes its result into it")
            return Prepared(array, array, False, info.dtype, info.nbytes // max(info.dtype.itemsize, 1))
        host = arrays.stage_to_host(array, name=name, writable=writable, copy=reads)
        return Prepared(host, array, True, host.dtype, host.size)
    if arrays.CPU not in takes:
        raise UnsupportedOperationError(
            f"{op}: backend {g.backend!r} moves CUDA arrays only, but {name} is in host memory; "
            f"move it to the GPU (cupy.asarray(...)) or use a CPU group: new_group(backend='tcp')"
        )
    host = arrays.as_host_array(array, name=name, writable=writable)
    return Prepared(host, array, False, host.dtype, host.size)


def prepare_list(g: Group, items: Any, name: str, op: str, like: Prepared | None, *, writable: bool,
                 reads: bool = True) -> list[Prepared]:
    """One array per rank, each like ``like`` (or like the first, when None)."""
    if not isinstance(items, (list, tuple)):
        raise InvalidArgumentError(f"{op}: {name} must be a list of arrays, got {type(items).__name__}")
    if len(items) != g.size:
        raise InvalidArgumentError(f"{op}: {name} has {len(items)} arrays but the group has {g.size} ranks")
    out = [prepare(g, a, f"{name}[{i}]", op, writable=writable, reads=reads) for i, a in enumerate(items)]
    for i, p in enumerate(out):
        same_layout(p, like or out[0], f"{name}[{i}]", op)
    return out


def same_layout(p: Prepared, like: Prepared, name: str, op: str) -> None:
    if p.dtype != like.dtype or p.count != like.count:
        raise InvalidArrayError(
            f"{op}: {name} has dtype {p.dtype} and {p.count} elements, but the array has "
            f"dtype {like.dtype} and {like.count} elements; they must match"
        )


def copy_back(prepared: Sequence[Prepared]) -> Callable[[], None] | None:
    """A function that copies staged results back to the caller's CUDA arrays (or None)."""
    staged = [p for p in prepared if p.staged]
    if not staged:
        return None

    def finish() -> None:
        for p in staged:
            arrays.copy_back(p.native, p.original)

    return finish


__all__ = ["Prepared", "copy_back", "prepare", "prepare_list", "same_layout"]
