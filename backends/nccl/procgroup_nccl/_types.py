"""How NumPy dtypes and procgroup ReduceOps map onto NCCL's types and ops.

Pure Python: the tables name NCCL constants (``"FLOAT32"`` for ``nccl.NCCL_FLOAT32``)
and :func:`resolve` looks them up in ``cupy.cuda.nccl`` only when an op runs, so the
mapping is importable and testable without a GPU.

Data movement (broadcast, all_gather, send/recv, ...) never looks at the dtype: it moves
bytes (``UINT8``, count = nbytes). Reductions need a native NCCL type: complex arrays
reduce as pairs of floats for the ops that act on each part separately (SUM, AVG),
bool arrays as uint8 with logical ops expressed as MIN/MAX. NCCL has no bitwise ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
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

#: Complex dtypes reduce as (real, imag) pairs of this float type.
COMPLEX_PAIRS: dict[str, str] = {"complex64": "FLOAT32", "complex128": "FLOAT64"}

#: ReduceOp -> NCCL op name for numeric dtypes.
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

#: Ops that act on the real and imaginary parts separately, so pairs of floats work.
COMPLEX_OPS: frozenset[ReduceOp] = frozenset({ReduceOp.SUM, ReduceOp.AVG})

#: First NCCL version (major*10000 + minor*100 + patch) with ncclAvg.
NCCL_AVG_MIN_VERSION = 21000

#: Data movement: bytes.
BYTE_TYPE = "UINT8"


@dataclass(frozen=True)
class ReducePlan:
    """How to run one reduction: NCCL type and op names, element count factor, divide."""

    nccl_type: str
    nccl_op: str
    factor: int  # NCCL elements per array element (2 for complex pairs)
    divide: bool  # AVG without ncclAvg: reduce with SUM, then divide by the group size

    def count(self, size: int) -> int:
        """NCCL element count for an array of ``size`` elements."""
        return size * self.factor


def reduce_plan(dtype: Any, op: ReduceOp, *, collective: str = "all_reduce",
                nccl_version: int = NCCL_AVG_MIN_VERSION) -> ReducePlan:
    """The plan for reducing ``dtype`` with ``op``, or a clear error naming op/dtype/device."""
    dt = np.dtype(dtype)
    name = dt.name

    def refuse(why: str) -> UnsupportedOperationError:
        return UnsupportedOperationError(
            f"{collective}: backend 'nccl' cannot apply {op.name} to dtype {dt} on cuda: {why}"
        )

    if not isinstance(op, ReduceOp):
        raise UnsupportedOperationError(f"{collective}: op must be a procgroup.ReduceOp, got {op!r}")
    if name == "bool":
        if op not in BOOL_OPS:
            raise refuse("NCCL has no logical xor; use a uint8 array and SUM, then % 2")
        return ReducePlan(BYTE_TYPE, BOOL_OPS[op], 1, False)
    if name in COMPLEX_PAIRS:
        if op not in COMPLEX_OPS:
            raise refuse("complex arrays reduce as (real, imag) float pairs, which only SUM and AVG allow")
        nccl_type, factor = COMPLEX_PAIRS[name], 2
    elif name in NCCL_DTYPES:
        nccl_type, factor = NCCL_DTYPES[name], 1
    else:
        supported = ", ".join([*NCCL_DTYPES, *COMPLEX_PAIRS, "bool"])
        raise refuse(f"NCCL reduces only {supported}; convert the array (e.g. int16 -> int32)")
    if op not in NCCL_OPS:
        raise refuse("NCCL has no bitwise reductions (BAND, BOR, BXOR); use a CPU group for them")
    if op is ReduceOp.AVG and nccl_version < NCCL_AVG_MIN_VERSION:
        return ReducePlan(nccl_type, "SUM", factor, True)
    return ReducePlan(nccl_type, NCCL_OPS[op], factor, False)


def resolve(name: str) -> int:
    """The ``cupy.cuda.nccl`` constant for an NCCL type or op name (``"FLOAT32"``)."""
    from cupy.cuda import nccl

    try:
        return int(getattr(nccl, f"NCCL_{name}"))
    except AttributeError:
        raise UnsupportedOperationError(
            f"this CuPy build's NCCL wrapper has no NCCL_{name}; upgrade cupy-cuda12x"
        ) from None


__all__ = [
    "BOOL_OPS",
    "BYTE_TYPE",
    "COMPLEX_OPS",
    "COMPLEX_PAIRS",
    "NCCL_AVG_MIN_VERSION",
    "NCCL_DTYPES",
    "NCCL_OPS",
    "ReducePlan",
    "reduce_plan",
    "resolve",
]
