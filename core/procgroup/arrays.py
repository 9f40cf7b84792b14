"""Array adapters: turn whatever the user passed into something a DataChannel can move.

Host data (NumPy arrays, anything with the buffer protocol or ``__array_interface__``,
CPU DLPack tensors) becomes a NumPy *view* of the caller's memory, so results are
written in place and nothing is copied. Device data (``__cuda_array_interface__`` or a
CUDA DLPack device) is passed as is to a backend that handles CUDA, and staged through
host memory (:func:`stage_to_host` / :func:`copy_back`) for one that does not.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _torch_tensors
from .errors import InvalidArrayError

CPU = "cpu"
CUDA = "cuda"
_DLPACK_CUDA_DEVICES = {2, 3, 13}  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged


def device_of(array: Any) -> str:
    """``"cuda"`` for arrays in GPU memory, ``"cpu"`` for everything else."""
    if isinstance(array, np.ndarray):
        return CPU
    if _torch_tensors.is_tensor(array):
        return _torch_tensors.device_kind(array)
    if hasattr(array, "__cuda_array_interface__"):
        return CUDA
    dl_device = getattr(array, "__dlpack_device__", None)
    if dl_device is not None:
        try:
            if int(dl_device()[0]) in _DLPACK_CUDA_DEVICES:
                return CUDA
        except Exception:  # noqa: BLE001 - a broken __dlpack_device__ is treated as host
            pass
    return CPU


def as_host_array(array: Any, *, name: str = "array", writable: bool = True) -> np.ndarray:
    """A NumPy view of host ``array``'s memory; clear errors for what cannot be used."""
    if isinstance(array, np.ndarray):
        arr = array
    elif _torch_tensors.is_tensor(array):
        arr = _torch_tensors.host_view(array, name)
    elif isinstance(array, (bytes, bytearray, memoryview)) or _has_buffer(array):
        view = memoryview(array)
        if not view.c_contiguous:
            raise InvalidArrayError(f"{name} must be C-contiguous; its buffer is not")
        try:
            arr = np.asarray(view)
        except (TypeError, ValueError) as exc:
            raise InvalidArrayError(
                f"{name}: buffer format {view.format!r} has no NumPy dtype ({exc})"
            ) from None
    elif hasattr(array, "__array_interface__"):
        arr = np.asarray(array)
    elif hasattr(array, "__dlpack__"):
        try:
            arr = np.from_dlpack(array)
        except Exception as exc:  # noqa: BLE001 - re-raised with the argument's name
            raise InvalidArrayError(f"{name}: cannot read it through DLPack ({exc})") from None
    else:
        raise InvalidArrayError(
            f"{name} must be a NumPy array, CuPy array or an object with the buffer "
            f"protocol, __cuda_array_interface__ or DLPack; got {type(array).__name__}"
        )
    if not arr.flags.c_contiguous:
        raise InvalidArrayError(
            f"{name} must be C-contiguous (got strides {arr.strides} for shape "
            f"{arr.shape}); pass np.ascontiguousarray(...) and copy the result back"
        )
    if writable and not arr.flags.writeable:
        raise InvalidArrayError(f"{name} is read-only, but this op writes its result into it")
    if arr.dtype.hasobject or arr.dtype.kind not in "biufc":
        raise InvalidArrayError(f"{name} has dtype {arr.dtype}; only numeric and bool dtypes move")
    if not arr.dtype.isnative:
        # transports and reductions read the machine's byte order; a swapped array would be
        # summed (and sent) as garbage
        raise InvalidArrayError(
            f"{name} has non-native byte order (dtype {arr.dtype.str!r}); convert it with "
            f"array.astype(array.dtype.newbyteorder('='))"
        )
    return arr


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


@dataclass(frozen=True)
class CudaArrayInfo:
    """What ``__cuda_array_interface__`` (v2/v3) says about a device array."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    read_only: bool
    host_backed: bool  # procgroup.testing's fake GPU array: "device" memory is host memory

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def cuda_info(array: Any, *, name: str = "array") -> CudaArrayInfo:
    """Read a device array's pointer, shape and dtype; reject non-contiguous ones."""
    if _torch_tensors.is_tensor(array):
        array = _torch_tensors.checked(array, name)
    cai = getattr(array, "__cuda_array_interface__", None)
    if cai is None:
        try:
            import cupy

            cai = cupy.from_dlpack(array).__cuda_array_interface__
        except Exception as exc:  # noqa: BLE001 - any failure: CuPy cannot read it, said as such
            raise InvalidArrayError(f"{name}: CUDA DLPack tensor needs CuPy to read ({exc})") from None
    shape = tuple(int(s) for s in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected = _c_strides(shape, dtype.itemsize)
        if tuple(strides) != expected and int(np.prod(shape)) > 1:
            raise InvalidArrayError(f"{name} must be C-contiguous (strides {tuple(strides)})")
    ptr, read_only = cai["data"]
    return CudaArrayInfo(
        int(ptr), shape, dtype, bool(read_only), bool(getattr(array, "_procgroup_host_backed", False))
    )


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for dim in reversed(shape):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


def _memcpy(dst: int, src: int, nbytes: int, *, host_backed: bool, to_device: bool) -> None:
    if nbytes == 0:
        return
    if host_backed:
        ctypes.memmove(dst, src, nbytes)
        return
    try:
        import cupy
    except ImportError:
        raise InvalidArrayError(
            "a CUDA array was given but CuPy is not installed to copy it to host memory"
        ) from None
    kind = cupy.cuda.runtime.memcpyHostToDevice if to_device else cupy.cuda.runtime.memcpyDeviceToHost
    cupy.cuda.runtime.memcpy(dst, src, nbytes, kind)


def stage_to_host(array: Any, *, name: str = "array", writable: bool = True, copy: bool = True) -> np.ndarray:
    """A host array for a device array (for backends without CUDA support).

    The caller runs the op on the result and then calls :func:`copy_back` when the op
    writes into the array. ``copy=False`` skips the device-to-host copy for arrays the
    op only writes (receive buffers). One helper serves every CPU backend.
    """
    info = cuda_info(array, name=name)
    if writable and info.read_only:
        raise InvalidArrayError(f"{name} is read-only, but this op writes its result into it")
    host = np.empty(info.shape, dtype=info.dtype)
    if copy:
        _memcpy(host.ctypes.data, info.ptr, info.nbytes, host_backed=info.host_backed, to_device=False)
    return host


def copy_back(host: np.ndarray, array: Any) -> None:
    """Write a staged host array's contents back into the device array it came from."""
    info = cuda_info(array)
    _memcpy(info.ptr, host.ctypes.data, info.nbytes, host_backed=info.host_backed, to_device=True)


__all__ = [
    "CPU",
    "CUDA",
    "CudaArrayInfo",
    "as_host_array",
    "copy_back",
    "cuda_info",
    "device_of",
    "stage_to_host",
]
