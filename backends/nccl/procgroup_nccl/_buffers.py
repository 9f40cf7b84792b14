"""Device buffers: pointer, size, dtype and GPU of any CUDA array NCCL is given.

Read through ``__cuda_array_interface__`` (CuPy, Numba, PyTorch, ...) by the core's
:func:`procgroup.arrays.cuda_info`, so nothing here depends on CuPy's array type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from procgroup import arrays
from procgroup.errors import InvalidArgumentError, InvalidArrayError


@dataclass(frozen=True)
class DeviceBuffer:
    """One CUDA array as NCCL sees it; ``owner`` keeps the memory alive while in flight."""

    ptr: int
    nbytes: int
    size: int
    dtype: np.dtype
    device: int
    owner: Any


def device_buffer(array: Any, name: str = "array") -> DeviceBuffer:
    """Describe ``array``; refuse host memory posing as device memory (fake GPU arrays)."""
    info = arrays.cuda_info(array, name=name)
    if info.host_backed:
        raise InvalidArrayError(
            f"{name} is a host-backed fake GPU array (procgroup.testing); backend 'nccl' "
            f"needs real device memory: use a CuPy array, or a CPU backend for fake arrays"
        )
    size = int(np.prod(info.shape, dtype=np.int64))
    return DeviceBuffer(info.ptr, info.nbytes, size, info.dtype, _device_of(array, info.ptr), array)


def _device_of(array: Any, ptr: int) -> int:
    """The GPU ordinal holding ``ptr`` (the current device for empty arrays)."""
    import cupy

    dev = getattr(array, "device", None)
    if isinstance(array, cupy.ndarray) and dev is not None:
        return int(dev.id)
    if ptr == 0:
        return int(cupy.cuda.Device().id)
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(ptr)
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError for a bad pointer
        raise InvalidArrayError(f"cannot tell which GPU holds the array at {ptr:#x}: {exc}") from None
    if int(getattr(attrs, "type", 2)) not in (2, 3):  # cudaMemoryTypeDevice / Managed
        raise InvalidArrayError(
            f"the array at {ptr:#x} is not in device memory (CUDA memory type {attrs.type}); "
            f"NCCL needs device or managed memory"
        )
    return int(attrs.device)


def same_device(buffers: Sequence[DeviceBuffer], op: str) -> int:
    """The one GPU all ``buffers`` live on; a clear error when they are spread out."""
    devices = sorted({b.device for b in buffers})
    if len(devices) != 1:
        raise InvalidArrayError(
            f"{op}: backend 'nccl' drives one GPU per process and group, but the arrays are on "
            f"cuda:{devices}; move them to one device (or use the *_multigpu calls)"
        )
    return devices[0]


def adjacent(buffers: Sequence[DeviceBuffer]) -> bool:
    """True when the buffers lie back to back in memory (one NCCL call can fill them)."""
    if not buffers:
        return False
    step = buffers[0].nbytes
    return all(b.ptr == buffers[0].ptr + i * step for i, b in enumerate(buffers))


def check_distinct_devices(buffers: Sequence[DeviceBuffer], op: str) -> tuple[int, ...]:
    """The device of each buffer of a *_multigpu list; each GPU may appear once."""
    devices = tuple(b.device for b in buffers)
    if len(set(devices)) != len(devices):
        raise InvalidArgumentError(
            f"{op}: each array of the list must be on a different GPU, got devices {list(devices)}"
        )
    return devices


__all__ = ["DeviceBuffer", "adjacent", "check_distinct_devices", "device_buffer", "same_device"]
