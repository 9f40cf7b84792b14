"""torch tensors as arrays, without importing torch.

A tensor is recognised by its type's module (``torch`` or ``torch.*``), so nothing here
imports torch: a program that never passes a tensor never loads it. A CPU tensor becomes
a NumPy view of its own storage (no copy); a CUDA tensor goes where CUDA arrays
go (``__cuda_array_interface__``). What cannot be moved as it is gets an error naming the
problem before anything is sent: a non-contiguous tensor, a device other than cpu/cuda,
a dtype with no NumPy equivalent (bfloat16, the float8 family, ...), a conjugate or
negative view. A tensor that requires grad is used through ``detach()`` (same storage),
as torch.distributed's collectives write into such tensors without autograd.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import InvalidArrayError

#: torch dtypes (by name) that NumPy has: everything else is refused by name
NUMPY_DTYPES = {
    "bool": np.bool_, "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64, "float16": np.float16,
    "float32": np.float32, "float64": np.float64, "complex64": np.complex64, "complex128": np.complex128,
}
#: the same, keyed by the torch dtype objects (built on the first tensor: torch is loaded then)
_movable: dict[Any, Any] = {}


def is_tensor(obj: Any) -> bool:
    """True for torch.Tensor and its subclasses (Parameter ...), without importing torch."""
    module = type(obj).__module__
    return (module == "torch" or module.startswith("torch.")) and hasattr(obj, "is_contiguous")


def device_kind(tensor: Any, name: str = "tensor") -> str:
    """"cpu" or "cuda"; any other device (meta, mps, xla ...) is an error naming it."""
    if tensor.is_cpu:
        return "cpu"
    if tensor.is_cuda:
        return "cuda"
    raise InvalidArrayError(f"{name} is a torch tensor on device {str(tensor.device)!r}, which procgroup "
                            f"cannot move; use a 'cpu' tensor (or 'cuda' with a backend that takes GPU "
                            f"arrays or stages them)")


def _numpy_dtype(tensor: Any) -> Any:
    if not _movable:
        torch = sys.modules["torch"]  # loaded: the caller passed a tensor
        _movable.update({getattr(torch, n): dt for n, dt in NUMPY_DTYPES.items() if hasattr(torch, n)})
    return _movable.get(tensor.dtype)


def checked(tensor: Any, name: str = "tensor") -> Any:
    """The tensor to move (detached: the same storage), after the checks every device needs."""
    device_kind(tensor, name)
    if _numpy_dtype(tensor) is None:
        raise InvalidArrayError(f"{name} has dtype {tensor.dtype}, which has no NumPy equivalent, so this backend "
                                f"cannot move or reduce it; convert it (e.g. tensor.float()) and back")
    if not tensor.is_contiguous():
        raise InvalidArrayError(f"{name} is a non-contiguous torch tensor (shape {tuple(tensor.shape)}, strides "
                                f"{tuple(tensor.stride())}); pass tensor.contiguous() and copy the result back")
    if tensor.is_conj() or tensor.is_neg():
        raise InvalidArrayError(f"{name} is a lazy conjugate/negative view; call .resolve_conj() / "
                                f".resolve_neg() first")
    return tensor.detach() if tensor.requires_grad else tensor


def host_view(tensor: Any, name: str = "tensor") -> np.ndarray:
    """A writable NumPy view of a CPU tensor's storage (no copy). ``Tensor.numpy()`` is that
    view; it costs less than a DLPack import of the same memory (docs/guide.md)."""
    return numpy_view(checked(tensor, name), name)


def numpy_view(t: Any, name: str = "tensor") -> np.ndarray:
    """:func:`host_view` of a tensor :func:`checked` already returned."""
    if not t.is_cpu:
        raise InvalidArrayError(f"{name} is on {str(t.device)!r}, not in host memory")
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise InvalidArrayError(f"{name}: cannot view the torch tensor as a NumPy array ({exc})") from None


__all__ = ["NUMPY_DTYPES", "checked", "device_kind", "host_view", "is_tensor", "numpy_view"]
