"""Which CUDA stream an op waits on and hands its result to.

By default that is CuPy's current stream of the array's device, as the caller sees it;
:func:`register_stream` (procgroup_nccl._register_stream, the seed's name) sets one stream
for every op of this process instead, e.g. a training loop's own stream.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from procgroup.errors import InvalidArgumentError

_lock = threading.Lock()
_registered: Any = None  # a cupy.cuda.Stream (or ExternalStream), or None


def register_stream(stream: Any) -> Any:
    """Use ``stream`` as the caller's stream for nccl ops; None goes back to the current one.

    Accepts a ``cupy.cuda.Stream``, anything with an integer ``ptr`` (a raw
    ``cudaStream_t`` holder) or a raw pointer int. Returns the previously registered one.
    """
    global _registered
    resolved = None if stream is None else _as_cupy_stream(stream)
    with _lock:
        previous, _registered = _registered, resolved
    return previous


def _as_cupy_stream(stream: Any) -> Any:
    import cupy

    external = getattr(cupy.cuda, "ExternalStream", None)
    if isinstance(stream, cupy.cuda.Stream) or (external is not None and isinstance(stream, external)):
        return stream
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if hasattr(stream, "__cuda_stream__") and from_external is not None:
        return from_external(stream)  # the CUDA stream protocol (PyTorch, cuda.core, ...)
    ptr = stream if isinstance(stream, int) and not isinstance(stream, bool) else getattr(stream, "ptr", None)
    if not isinstance(ptr, int) or isinstance(ptr, bool) or external is None:
        raise InvalidArgumentError(
            f"_register_stream: expected a cupy.cuda.Stream, an object with __cuda_stream__ or "
            f"an int .ptr, or a cudaStream_t pointer; got {type(stream).__name__}"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # CuPy 14 prefers from_external
        return external(ptr)


def registered_stream() -> Any:
    """The stream set by :func:`register_stream`, or None."""
    return _registered


def caller_stream() -> Any:
    """The stream the caller's work runs on, for the current device of this thread."""
    import cupy

    stream = _registered
    return stream if stream is not None else cupy.cuda.get_current_stream()


__all__ = ["caller_stream", "register_stream", "registered_stream"]
