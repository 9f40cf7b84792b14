"""torch tensors as arrays, without importing torch.

A tensor is recognised by its type's module (``torch`` or ``torch.*``), so nothing here
imports torch: a program that never passes a tensor never loads it. A CPU tensor becomes
a NumPy view of its own storage (DLPack, no copy); a CUDA tensor goes where CUDA arrays
go (``__cuda_array_interface__``). What cannot be moved as it is gets an error naming the
problem before anything is sent: a non-contiguous tensor, a device other than cpu/cuda,
a dtype with no NumPy equivalent (bfloat16, the float8 family, ...), a conjugate or
negative view. A tensor that requires grad is used through ``detach()`` (same storage),
as torch.distributed's collectives write into such tensors without autograd.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InvalidArrayError

#: torch dtypes (their str) that NumPy has: everything else is refused by name
NUMPY_DTYPES = {
    "torch.bool": np.bool_, "torch.uint8": np.uint8, "torch.int8": np.int8, "torch.int16": np.int16,
    "torch.int32": np.int32, "torch.int64": np.int64, "torch.uint16": np.uint16, "torch.uint32": np.uint32,
    "torch.uint64": np.uint64, "torch.float16": np.float16, "torch.float32": np.float32,
    "torch.float64": np.float64, "torch.complex64": np.complex64, "torch.complex128": np.complex128,
}
_DEVICES = ("cpu", "cuda")


def is_tensor(obj: Any) -> bool:
    """True for torch.Tensor and its subclasses (Parameter ...), without importing torch."""
    module = type(obj).__module__
    return (module == "torch" or module.startswith("torch.")) and hasattr(obj, "is_contiguous")


def device_kind(tensor: Any, name: str = "tensor") -> str:
    """"cpu" or "cuda"; any other device (meta, mps, xla ...) is an error naming it."""
    kind = str(tensor.device.type)
    if kind not in _DEVICES:
        raise InvalidArrayError(f"{name} is a torch tensor on device {str(tensor.device)!r}, which procgroup "
                                f"cannot move; use a 'cpu' tensor (or 'cuda' with a backend that takes GPU "
                                f"arrays or stages them)")
    return kind


def checked(tensor: Any, name: str = "tensor") -> Any:
    """The tensor to move (detached: the same storage), after the checks every device needs."""
    device_kind(tensor, name)
    dtype = str(tensor.dtype)
    if dtype not in NUMPY_DTYPES:
        raise InvalidArrayError(f"{name} has dtype {dtype}, which has no NumPy equivalent, so this backend "
                                f"cannot move or reduce it; convert it (e.g. tensor.float()) and back")
    if not tensor.is_contiguous():
        raise InvalidArrayError(f"{name} is a non-contiguous torch tensor (shape {tuple(tensor.shape)}, strides "
                                f"{tuple(tensor.stride())}); pass tensor.contiguous() and copy the result back")
    if tensor.is_conj() or tensor.is_neg():
        raise InvalidArrayError(f"{name} is a lazy conjugate/negative view; call .resolve_conj() / "
                                f".resolve_neg() first")
    return tensor.detach() if tensor.requires_grad else tensor


def host_view(tensor: Any, name: str = "tensor") -> np.ndarray:
    """A writable NumPy view of a CPU tensor's storage (no copy)."""
    t = checked(tensor, name)
    if device_kind(t, name) != "cpu":
        raise InvalidArrayError(f"{name} is on {str(t.device)!r}, not in host memory")
    try:
        arr = np.from_dlpack(t)
    except (BufferError, TypeError, RuntimeError) as exc:
        raise InvalidArrayError(f"{name}: cannot read the torch tensor through DLPack ({exc})") from None
    if not arr.flags.writeable:  # NumPy < 2 marks DLPack imports read-only; .numpy() is the same memory
        arr = t.numpy()
    return arr


__all__ = ["NUMPY_DTYPES", "checked", "device_kind", "host_view", "is_tensor"]
