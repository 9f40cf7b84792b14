"""The caller's arrays as MPI buffers, without copies.

A list of separate arrays (all_gather's outputs, gather_list, ...) becomes one MPI
``v`` buffer: byte displacements of each array from the lowest address, so MPI reads
and writes the caller's arrays directly, and every rank calls the same ``v``
collective whatever its own memory layout. Host and device (CUDA-aware MPI) arrays
alike: the address comes from the array interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

_fromaddress = MPI.buffer.fromaddress
_BYTE = MPI.BYTE


def address(array: Any) -> int:
    """The first byte of a (host or device) C-contiguous array."""
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return int(array.__cuda_array_interface__["data"][0])


def nbytes(array: Any) -> int:
    if hasattr(array, "nbytes"):
        return int(array.nbytes)
    return int(np.prod(array.shape)) * np.dtype(array.dtype).itemsize


def spread(arrays: Sequence[Any], readonly: bool) -> list[Any]:
    """One MPI ``v`` buffer over separate arrays: bytes from the lowest address, no copy."""
    addrs = [address(a) for a in arrays]
    sizes = [nbytes(a) for a in arrays]
    base = min(addrs)
    span = max(a + n for a, n in zip(addrs, sizes)) - base
    buf = _fromaddress(base, span, readonly=readonly)
    return [buf, (sizes, [a - base for a in addrs]), _BYTE]


def span(arrays: Sequence[Any]) -> Any:
    """A read-only buffer over ``arrays`` when they lie back to back in order (views of
    one buffer), else None."""
    start = addr = address(arrays[0])
    for a in arrays:
        if address(a) != addr:
            return None
        addr += nbytes(a)
    return _fromaddress(start, addr - start, readonly=True)


def concatenate(arrays: Sequence[Any]) -> Any:
    """One contiguous copy of ``arrays`` (NumPy, or CuPy for device arrays)."""
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.concatenate([a.reshape(-1) for a in arrays])
    import cupy  # GPU arrays only (CuPy)

    return cupy.concatenate([cupy.asarray(a).reshape(-1) for a in arrays])


__all__ = ["address", "concatenate", "nbytes", "span", "spread"]
