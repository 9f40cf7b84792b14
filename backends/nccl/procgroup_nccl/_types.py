"""How NumPy dtypes and procgroup ReduceOps map onto NCCL's types and ops, as ReduceTables.

Pure Python: the tables name NCCL constants (``"FLOAT32"`` for ``nccl.NCCL_FLOAT32``)
and their ``resolve`` looks them up in ``cupy.cuda.nccl`` only when an op runs, so the
mapping is importable and testable without a GPU (``reduce_table(names=True)`` keeps
the names).

Data movement (broadcast, all_gather, send/recv, ...) never looks at the dtype: it moves
bytes (``UINT8``, count = nbytes). Reductions need a native NCCL type: complex arrays
reduce as pairs of floats for the ops that act on each part separately (SUM, AVG),
bool arrays as uint8 with logical ops expressed as MIN/MAX. NCCL has no bitwise ops.
ncclAvg exists from NCCL 2.10; before, AVG is SUM then one division.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from procgroup.backend import Lowered, ReduceTable
from procgroup.errors import UnsupportedOperationError
from procgroup.ops import ReduceOp

#: NumPy dtype name -> NCCL datatype name, for reductions.
NCCL_DTYPES: dict[str, str] = {
    "int8": "INT8",
    "uint8": "UINT8",
    "int32": "INT32",
    "uint32": "UINT32",
    "int64": "INT64",
    "uint64": "UINT64",
    "float16": "FLOAT16",
    "float32": "FLOAT32",
    "float64": "FLOAT64",
    "bfloat16": "BFLOAT16",  # ml_dtypes' bfloat16, where installed
}

#: ReduceOp -> NCCL op name for numeric dtypes (AVG only where NCCL has ncclAvg).
NCCL_OPS: dict[ReduceOp, str] = {
    ReduceOp.SUM: "SUM",
    ReduceOp.PRODUCT: "PROD",
    ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX",
    ReduceOp.AVG: "AVG",
}

#: ReduceOp -> NCCL op on bool arrays (moved as uint8 0/1): the logical meaning the core
#: gives each op on bool (SUM = or, PRODUCT = and), as MIN/MAX on 0/1.
BOOL_OPS: dict[ReduceOp, str] = {
    ReduceOp.SUM: "MAX",
    ReduceOp.MAX: "MAX",
    ReduceOp.BOR: "MAX",
    ReduceOp.PRODUCT: "MIN",
    ReduceOp.MIN: "MIN",
    ReduceOp.BAND: "MIN",
}

#: First NCCL version (major*10000 + minor*100 + patch) with ncclAvg.
NCCL_AVG_MIN_VERSION = 21000

#: Data movement: bytes.
BYTE_TYPE = "UINT8"

_BITWISE = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})


def resolve(name: str) -> int:
    """The ``cupy.cuda.nccl`` constant for an NCCL type or op name (``"FLOAT32"``)."""
    from cupy.cuda import nccl

    try:
        return int(getattr(nccl, f"NCCL_{name}"))
    except AttributeError:
        raise UnsupportedOperationError(
            f"this CuPy build's NCCL wrapper has no NCCL_{name}; upgrade cupy-cuda12x"
        ) from None


def _keep_name(name: str) -> str:
    return name


class NcclTable(ReduceTable):
    """A ReduceTable whose refusals say what NCCL lacks (bitwise ops, logical xor)."""

    def why_not(self, dtype: Any, op: ReduceOp) -> str:
        dt = np.dtype(dtype)
        if dt.kind == "b" and op is ReduceOp.BXOR:
            return "NCCL has no logical xor; use a uint8 array and SUM, then % 2"
        if op in _BITWISE and dt.kind in "iu":
            return "NCCL has no bitwise reductions (BAND, BOR, BXOR); use a CPU group for them"
        return super().why_not(dtype, op).replace("it reduces only", "NCCL reduces only")


def _table(avg: bool, names: bool) -> NcclTable:
    ops: dict[ReduceOp, str] = NCCL_OPS if avg else {k: v for k, v in NCCL_OPS.items() if k is not ReduceOp.AVG}
    return NcclTable(backend="nccl", dtypes=NCCL_DTYPES, ops=ops, bool_ops=BOOL_OPS, bool_as="uint8",
                     resolve=_keep_name if names else resolve)


#: (has ncclAvg, keep names) -> table; built once, so lowering plans are cached per table.
_TABLES = {(avg, names): _table(avg, names) for avg in (True, False) for names in (True, False)}


def reduce_table(nccl_version: int = NCCL_AVG_MIN_VERSION, *, names: bool = False) -> NcclTable:
    """The table for this NCCL version; ``names=True`` keeps NCCL names instead of constants."""
    return _TABLES[nccl_version >= NCCL_AVG_MIN_VERSION, names]


def reduce_plan(dtype: Any, op: ReduceOp, *, collective: str = "all_reduce",
                table: ReduceTable | None = None) -> Lowered:
    """The plan for reducing ``dtype`` with ``op``, or a clear error naming op/dtype/device."""
    if not isinstance(op, ReduceOp):
        raise UnsupportedOperationError(f"{collective}: op must be a procgroup.ReduceOp, got {op!r}")
    return (table or reduce_table()).require(dtype, op, collective, "cuda")


__all__ = [
    "BOOL_OPS",
    "BYTE_TYPE",
    "NCCL_AVG_MIN_VERSION",
    "NCCL_DTYPES",
    "NCCL_OPS",
    "NcclTable",
    "reduce_plan",
    "reduce_table",
    "resolve",
]
