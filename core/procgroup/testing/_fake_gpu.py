"""A fake GPU array: ``__cuda_array_interface__`` over host memory.

It lets every CUDA code path of the core (detection, staging to host, copying back)
run on machines without a GPU. The ``_procgroup_host_backed`` attribute tells the
staging helper to copy with memmove instead of cudaMemcpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class FakeGpuArray:
    """Looks like a CuPy array to procgroup; ``.host`` is the memory behind it."""

    _procgroup_host_backed = True

    def __init__(self, data: Any, dtype: Any = None) -> None:
        self.host = np.ascontiguousarray(np.array(data, dtype=dtype))

    @classmethod
    def zeros(cls, shape: Any, dtype: Any = np.float32) -> FakeGpuArray:
        return cls(np.zeros(shape, dtype=dtype))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.host.shape

    @property
    def dtype(self) -> np.dtype:
        return self.host.dtype

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.host.shape,
            "typestr": self.host.dtype.str,
            "data": (self.host.ctypes.data, not self.host.flags.writeable),
            "strides": None,
            "version": 3,
        }

    def get(self) -> np.ndarray:
        """A host copy, like ``cupy.ndarray.get()``."""
        return self.host.copy()
