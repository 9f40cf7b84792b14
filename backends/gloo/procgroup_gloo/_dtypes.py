"""How NumPy dtypes and procgroup ReduceOps map onto what each gloo engine reduces.

Both engines declare a :class:`procgroup.backend.ReduceTable`; the table derives the
rest the same way for both: bool as 0/1 bytes (OR = MAX, AND = MIN), complex SUM/AVG
as floats of twice the length, AVG as SUM then one division. What a table cannot lower
falls back to the SDK's algorithms over the side channel, so every (dtype, op) pair is
supported on both engines; only the path differs. Data movement (broadcast, gather,
...) never looks at values, so it runs on bytes.

- pygloo reduces int8, uint8, int32, uint32, int64, uint64, float16, float32 and
  float64 with SUM, PRODUCT, MIN and MAX (it rejects the bitwise ops for every dtype).
  Entries are pygloo's names, looked up when an op first runs (pygloo is imported lazily).
- torch's ProcessGroupGloo reduces int8, uint8, int32, int64, float16, float32 and
  float64 with SUM, PRODUCT, MIN, MAX, and BAND/BOR/BXOR on integers; it has no unsigned
  32/64-bit types ("Invalid scalar type"). Wrap-around SUM and PRODUCT and the bitwise ops
  give the same bits on a signed view, so uint32/uint64 travel as int32/int64 for those;
  their MIN/MAX (signed order differs) fall back. Entries are NumPy dtype names: the
  engine views the caller's array as that dtype, then hands it to torch without a copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from procgroup.backend import ReduceTable
from procgroup.ops import ReduceOp


def _resolve_pygloo(name: str) -> Any:
    """pygloo's constant for a table entry: ``glooFloat32`` (a type) or ``SUM`` (an op)."""
    import pygloo

    kind = pygloo.glooDataType_t if name.startswith("gloo") else pygloo.ReduceOp
    return getattr(kind, name)


_BOOL_OPS = {ReduceOp.SUM: "MAX", ReduceOp.MAX: "MAX", ReduceOp.BOR: "MAX",
             ReduceOp.PRODUCT: "MIN", ReduceOp.MIN: "MIN", ReduceOp.BAND: "MIN"}

PYGLOO = ReduceTable(
    backend="gloo",
    dtypes={
        "int8": "glooInt8", "uint8": "glooUint8", "int32": "glooInt32", "uint32": "glooUint32",
        "int64": "glooInt64", "uint64": "glooUint64", "float16": "glooFloat16",
        "float32": "glooFloat32", "float64": "glooFloat64",
    },
    ops={ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX"},
    bool_ops=_BOOL_OPS,
    resolve=_resolve_pygloo,
)


def _resolve_torch(name: str) -> Any:
    """torch's ReduceOp for an op entry (``SUM``); a NumPy dtype for a dtype entry."""
    if name.isupper():
        from torch.distributed import ReduceOp as TorchReduceOp

        return getattr(TorchReduceOp, name)
    return np.dtype(name)


_NUMERIC = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX"}
_BITWISE = {ReduceOp.BAND: "BAND", ReduceOp.BOR: "BOR", ReduceOp.BXOR: "BXOR"}
_WRAPPING = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", **_BITWISE}

TORCH = ReduceTable(
    backend="gloo",
    dtypes={
        "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "int32",
        "int64": "int64", "uint64": "int64", "float16": "float16",
        "float32": "float32", "float64": "float64",
    },
    ops=_NUMERIC,
    bool_ops=_BOOL_OPS,
    ops_by_dtype={
        "int8": {**_NUMERIC, **_BITWISE}, "uint8": {**_NUMERIC, **_BITWISE},
        "int32": {**_NUMERIC, **_BITWISE}, "int64": {**_NUMERIC, **_BITWISE},
        "uint32": _WRAPPING, "uint64": _WRAPPING,
    },
    resolve=_resolve_torch,
)

#: The table of each engine, by engine name.
TABLES = {"pygloo": PYGLOO, "torch": TORCH}


__all__ = ["PYGLOO", "TABLES", "TORCH"]
