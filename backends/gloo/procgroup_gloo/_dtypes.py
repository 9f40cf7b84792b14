"""How NumPy dtypes and procgroup ReduceOps map onto what pygloo can reduce, as a ReduceTable.

gloo reduces int8, uint8, int32, uint32, int64, uint64, float16, float32 and float64
with SUM, PRODUCT, MIN and MAX (pygloo rejects the bitwise ops for every dtype). The
table says so; :class:`procgroup.backend.ReduceTable` derives the rest: bool as 0/1
bytes (OR = MAX, AND = MIN), complex SUM/AVG as floats of twice the length, AVG as SUM
then one division. What it cannot lower (int16, bitwise ops, complex PRODUCT) falls
back to the core's algorithms over the side channel. Data movement (broadcast, gather,
...) never looks at values, so it runs on bytes.

Entries are pygloo's names, looked up when an op first runs (pygloo is imported lazily).
"""

from __future__ import annotations

from typing import Any

from procgroup.backend import ReduceTable
from procgroup.ops import ReduceOp


def _resolve(name: str) -> Any:
    """pygloo's constant for a table entry: ``glooFloat32`` (a type) or ``SUM`` (an op)."""
    import pygloo

    kind = pygloo.glooDataType_t if name.startswith("gloo") else pygloo.ReduceOp
    return getattr(kind, name)


TABLE = ReduceTable(
    backend="gloo",
    dtypes={
        "int8": "glooInt8", "uint8": "glooUint8", "int32": "glooInt32", "uint32": "glooUint32",
        "int64": "glooInt64", "uint64": "glooUint64", "float16": "glooFloat16",
        "float32": "glooFloat32", "float64": "glooFloat64",
    },
    ops={ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX"},
    bool_ops={ReduceOp.SUM: "MAX", ReduceOp.MAX: "MAX", ReduceOp.BOR: "MAX",
              ReduceOp.PRODUCT: "MIN", ReduceOp.MIN: "MIN", ReduceOp.BAND: "MIN"},
    resolve=_resolve,
)


lower = TABLE.lower


__all__ = ["TABLE", "lower"]
