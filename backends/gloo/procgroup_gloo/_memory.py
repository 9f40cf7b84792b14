"""The caller's memory as pygloo takes it: raw pointers, byte views, and one buffer over a list.

gloo's gathering collectives write one contiguous buffer. When the caller's list of
arrays already lies end to end (views of one array) that buffer is their own memory;
otherwise a landing buffer is used and spread into the list afterwards.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np


def byte_view(array: np.ndarray) -> np.ndarray:
    """The array's memory as uint8, without copying."""
    return array.reshape(-1).view(np.uint8)


def address(array: np.ndarray) -> int:
    """The data pointer pygloo reads from or writes to."""
    return int(array.__array_interface__["data"][0])


def landing(arrays: Sequence[Any], nbytes: int, fill: bool = False) -> tuple[np.ndarray, bool]:
    """One uint8 buffer over ``arrays`` laid end to end: their own memory when it already
    is contiguous (no copy), else a new buffer (``staged`` True), filled from them if ``fill``."""
    base = address(byte_view(arrays[0]))
    if all(address(byte_view(a)) == base + i * nbytes for i, a in enumerate(arrays)):
        raw = (ctypes.c_uint8 * (nbytes * len(arrays))).from_address(base)
        return np.frombuffer(memoryview(raw), dtype=np.uint8), False
    buf = np.empty(nbytes * len(arrays), dtype=np.uint8)
    for i, a in enumerate(arrays if fill else ()):
        buf[i * nbytes:(i + 1) * nbytes] = byte_view(a)
    return buf, True


def spread(buf: np.ndarray, arrays: Sequence[Any], nbytes: int) -> None:
    """Copy the pieces of a landing buffer into ``arrays``."""
    for i, a in enumerate(arrays):
        byte_view(a)[:] = buf[i * nbytes:(i + 1) * nbytes]


__all__ = ["address", "byte_view", "landing", "spread"]
