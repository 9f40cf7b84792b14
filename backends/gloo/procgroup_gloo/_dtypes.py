"""How NumPy dtypes and procgroup ReduceOps map onto what pygloo can reduce.

gloo reduces int8, uint8, int32, uint32, int64, uint64, float16, float32 and float64
with SUM, PRODUCT, MIN and MAX (pygloo rejects the bitwise ops for every dtype).
Data movement (broadcast, gather, ...) never looks at values, so it runs on bytes.
Reductions gloo lacks are reinterpreted where that is exact, else they return None and
the channel falls back to the core's algorithms:

- bool: values are 0/1 bytes, so OR = MAX and AND = MIN over uint8.
- complex: SUM (and AVG) add real and imaginary parts independently, so a complex array
  reduces as the float array of twice the length; PRODUCT does not and falls back.
- AVG: SUM, then the channel divides once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from procgroup.ops import ReduceOp


def _gloo() -> Any:
    import pygloo

    return pygloo


@dataclass(frozen=True)
class ReducePlan:
    """A reduction pygloo can do: reinterpret the array as ``view``, reduce with ``op``."""

    view: np.dtype | None  # None: use the array's own dtype
    gloo_dtype: Any
    gloo_op: Any
    average: bool


@functools.cache
def gloo_dtype(dtype: np.dtype) -> Any:
    """pygloo's glooDataType_t for a NumPy dtype, or None when gloo has no such type."""
    g = _gloo().glooDataType_t
    table = {
        "int8": g.glooInt8, "uint8": g.glooUint8, "int32": g.glooInt32, "uint32": g.glooUint32,
        "int64": g.glooInt64, "uint64": g.glooUint64, "float16": g.glooFloat16,
        "float32": g.glooFloat32, "float64": g.glooFloat64,
    }
    dt = np.dtype(dtype)
    if not dt.isnative:
        return None
    return table.get(dt.name)


@functools.cache
def reduce_plan(dtype: np.dtype, op: ReduceOp) -> ReducePlan | None:
    """How pygloo reduces ``dtype`` with ``op``; None means "use the core's algorithm"."""
    g = _gloo().ReduceOp
    dt = np.dtype(dtype)
    if dt.kind == "b":
        as_u8 = {ReduceOp.SUM: g.MAX, ReduceOp.MAX: g.MAX, ReduceOp.BOR: g.MAX,
                 ReduceOp.PRODUCT: g.MIN, ReduceOp.MIN: g.MIN, ReduceOp.BAND: g.MIN}
        if op not in as_u8:
            return None
        return ReducePlan(np.dtype(np.uint8), gloo_dtype(np.dtype(np.uint8)), as_u8[op], False)
    if dt.kind == "c":
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            return None
        part = np.dtype(f"f{dt.itemsize // 2}")
        gd = gloo_dtype(part) if dt.isnative else None
        return None if gd is None else ReducePlan(part, gd, g.SUM, op is ReduceOp.AVG)
    gd = gloo_dtype(dt)
    arith = {ReduceOp.SUM: g.SUM, ReduceOp.AVG: g.SUM, ReduceOp.PRODUCT: g.PRODUCT,
             ReduceOp.MIN: g.MIN, ReduceOp.MAX: g.MAX}
    if gd is None or op not in arith:
        return None  # int16/uint16/..., or a bitwise op: core algorithm
    return ReducePlan(None, gd, arith[op], op is ReduceOp.AVG)


def flat(array: np.ndarray, view: np.dtype | None = None) -> np.ndarray:
    """A 1-d view of a C-contiguous array, optionally reinterpreted; never a copy."""
    out = array.reshape(-1)
    return out if view is None or view == out.dtype else out.view(view)


def byte_view(array: np.ndarray) -> np.ndarray:
    """The array's memory as uint8, without copying."""
    return array.reshape(-1).view(np.uint8)


def address(array: np.ndarray) -> int:
    """The data pointer pygloo reads from or writes to."""
    return int(array.__array_interface__["data"][0])


__all__ = ["ReducePlan", "address", "byte_view", "flat", "gloo_dtype", "reduce_plan"]
