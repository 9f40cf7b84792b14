"""NumPy dtypes -> MPI datatypes, and (ReduceOp, dtype) -> (MPI datatype, MPI op).

The reductions are declared as a :class:`procgroup.backend.ReduceTable`. MPI has
predefined reductions for the C types, but none for float16 (MPICH's ``MPIX_C_FLOAT16``
carries it, without reductions everywhere) and only logical ones for ``C_BOOL``:

- bool reduces as ``C_BOOL`` with ``LAND``/``LOR``/``LXOR``, as NumPy means each op;
- float16 travels as ``UINT16_T`` (a 2-byte type every MPI has) and reduces through
  user-defined ops (``MPI.Op.Create`` over a NumPy ufunc, in place), made on first use;
- complex reduces natively (``C_FLOAT_COMPLEX``...): the table's float-pair lowering
  has no PRODUCT, which MPI's complex types do have;
- AVG is SUM, then one division by the group size (``Plan.divide``).

:func:`reduce_plan` caches the answer per (op, dtype), so a call costs one dict lookup.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI
from procgroup.backend import ReduceTable
from procgroup.errors import UnsupportedOperationError
from procgroup.ops import ReduceOp

log = logging.getLogger(__name__)

_FLOAT16 = np.dtype(np.float16)

#: NumPy dtype name -> the predefined MPI datatype that carries it (float16: 2 bytes).
DATATYPES: dict[str, Any] = {
    "bool": MPI.C_BOOL,
    "int8": MPI.INT8_T, "int16": MPI.INT16_T, "int32": MPI.INT32_T, "int64": MPI.INT64_T,
    "uint8": MPI.UINT8_T, "uint16": MPI.UINT16_T, "uint32": MPI.UINT32_T, "uint64": MPI.UINT64_T,
    "float16": MPI.UINT16_T, "float32": MPI.FLOAT, "float64": MPI.DOUBLE,
    np.dtype(np.longdouble).name: MPI.LONG_DOUBLE,
}
#: complex dtypes reduce natively (see the module docstring), so they stay out of the table.
_COMPLEX: dict[str, Any] = {
    "complex64": MPI.C_FLOAT_COMPLEX, "complex128": MPI.C_DOUBLE_COMPLEX,
    np.dtype(np.clongdouble).name: MPI.C_LONG_DOUBLE_COMPLEX,
}
_COMPLEX_OPS: dict[ReduceOp, Any] = {ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD}


@functools.cache
def _ufunc_op(ufunc: np.ufunc) -> Any:
    """A commutative MPI op reducing float16 carried as UINT16_T: inout = ufunc(inout, in)."""
    log.debug("creating a user-defined MPI op for %s on float16", ufunc.__name__)

    def reduce_f16(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        acc = np.frombuffer(inoutbuf, dtype=np.float16)
        ufunc(acc, np.frombuffer(inbuf, dtype=np.float16), out=acc)

    return MPI.Op.Create(reduce_f16, commute=True)


def _resolve(entry: Any) -> Any:
    """Table entries are MPI constants, or ufuncs that become user-defined ops when used."""
    return _ufunc_op(entry) if isinstance(entry, np.ufunc) else entry


REDUCTIONS = ReduceTable(
    backend="mpi",
    dtypes=DATATYPES,
    ops={
        ReduceOp.SUM: MPI.SUM, ReduceOp.PRODUCT: MPI.PROD, ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX,
        ReduceOp.BAND: MPI.BAND, ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR,
    },
    bool_ops={
        ReduceOp.SUM: MPI.LOR, ReduceOp.PRODUCT: MPI.LAND, ReduceOp.MIN: MPI.LAND, ReduceOp.MAX: MPI.LOR,
        ReduceOp.BAND: MPI.LAND, ReduceOp.BOR: MPI.LOR, ReduceOp.BXOR: MPI.LXOR,
    },
    bool_as="bool",
    ops_by_dtype={"float16": {
        ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    }},
    resolve=_resolve,
)


class Plan(NamedTuple):
    """What MPI is called with for one (op, dtype): ``divide`` after AVG's SUM."""

    datatype: Any
    op: Any
    divide: bool


_datatypes: dict[np.dtype, Any] = {}
#: (op, dtype) -> Plan, filled by reduce_plan: the hot path reads it directly.
PLANS: dict[tuple[ReduceOp, np.dtype], Plan] = {}


def datatype_of(dtype: Any) -> Any:
    """The MPI datatype carrying ``dtype``, cached per dtype (hot path: one dict lookup)."""
    try:
        return _datatypes[dtype]
    except KeyError:
        pass
    dt = np.dtype(dtype)
    mpi_type = DATATYPES.get(dt.name) or _COMPLEX.get(dt.name)
    if mpi_type is None or not dt.isnative:
        raise UnsupportedOperationError(f"the mpi backend has no MPI datatype for dtype {dt}")
    _datatypes[dtype] = mpi_type
    return mpi_type


def reduce_plan(op: ReduceOp, dtype: Any, collective: str = "all_reduce") -> Plan:
    """The :class:`Plan` reducing ``dtype`` with ``op`` (the core already checked they fit)."""
    key = (op, dtype)
    try:
        return PLANS[key]
    except KeyError:
        pass
    dt = np.dtype(dtype)
    if dt.kind == "c":
        divide = op is ReduceOp.AVG
        mpi_op = _COMPLEX_OPS.get(ReduceOp.SUM if divide else op)
        if mpi_op is None:
            raise UnsupportedOperationError(f"{collective}: backend 'mpi' cannot apply {op.name} to dtype {dt}")
        plan = Plan(datatype_of(dt), mpi_op, divide)
    else:
        lowered = REDUCTIONS.require(dt, op, collective)
        plan = Plan(lowered.dtype, lowered.op, lowered.divide)
    PLANS[key] = plan
    return plan


__all__ = ["DATATYPES", "PLANS", "REDUCTIONS", "Plan", "datatype_of", "reduce_plan"]
