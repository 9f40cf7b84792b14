"""NumPy dtypes -> MPI datatypes and procgroup ReduceOps -> MPI ops.

MPI has predefined reductions for the C types, but none for float16 (MPICH's
``MPIX_C_FLOAT16`` carries it, without reductions everywhere) and only logical ones for
``C_BOOL``. Those go through user-defined ops (``MPI.Op.Create``) that reduce with
NumPy in place, built once per (op, dtype) and cached. float16 travels as ``UINT16_T``,
a predefined 2-byte type every MPI has. Everything is cached per dtype, so a call costs
one dict lookup.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI
from procgroup.errors import UnsupportedOperationError
from procgroup.ops import ReduceOp

log = logging.getLogger(__name__)

#: ReduceOps with a predefined MPI op for integer/float/complex dtypes. AVG is summed
#: and divided afterwards, as in procgroup.ops.
_NATIVE_OPS: dict[ReduceOp, Any] = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.AVG: MPI.SUM,
    ReduceOp.PRODUCT: MPI.PROD,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.BAND: MPI.BAND,
    ReduceOp.BOR: MPI.BOR,
    ReduceOp.BXOR: MPI.BXOR,
}

#: bool follows NumPy's meaning of each op (procgroup.ops), with MPI's logical ops,
#: which the standard defines for C_BOOL.
_BOOL_OPS: dict[ReduceOp, Any] = {
    ReduceOp.SUM: MPI.LOR,
    ReduceOp.PRODUCT: MPI.LAND,
    ReduceOp.MIN: MPI.LAND,
    ReduceOp.MAX: MPI.LOR,
    ReduceOp.BAND: MPI.LAND,
    ReduceOp.BOR: MPI.LOR,
    ReduceOp.BXOR: MPI.LXOR,
}

_FLOAT16_UFUNCS: dict[ReduceOp, Callable[..., Any]] = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}

_FLOAT16 = np.dtype(np.float16)


@functools.cache
def mpi_datatype(dtype: np.dtype) -> Any:
    """The predefined MPI datatype that carries ``dtype`` (float16: a 2-byte integer)."""
    if dtype == _FLOAT16:
        return MPI.UINT16_T
    try:
        return MPI.Datatype.fromcode(dtype.char)
    except (KeyError, ValueError) as exc:
        raise UnsupportedOperationError(f"the mpi backend has no MPI datatype for dtype {dtype} ({exc})") from None


def _float16_op(ufunc: Callable[..., Any]) -> Any:
    """A commutative MPI op reducing float16 carried as UINT16_T: inout = ufunc(inout, in)."""

    def reduce_f16(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        acc = np.frombuffer(inoutbuf, dtype=np.float16)
        other = np.frombuffer(inbuf, dtype=np.float16)
        ufunc(acc, other, out=acc)

    return MPI.Op.Create(reduce_f16, commute=True)


@functools.cache
def mpi_op(op: ReduceOp, dtype: np.dtype) -> Any:
    """The MPI op computing ``op`` on ``dtype`` (the core already checked they fit)."""
    if dtype.kind == "b":
        return _BOOL_OPS[op]
    if dtype == _FLOAT16:
        ufunc = _FLOAT16_UFUNCS.get(op)
        if ufunc is None:
            raise UnsupportedOperationError(f"the mpi backend cannot reduce float16 with {op.name}")
        log.debug("creating a user-defined MPI op for %s on float16", op.name)
        return _float16_op(ufunc)
    return _NATIVE_OPS[op]


_DATATYPES: dict[str, Any] = {}
_OPS: dict[tuple[int, str], Any] = {}


def datatype_of(array: Any) -> Any:
    """:func:`mpi_datatype` of ``array.dtype`` through a dict on the type code (hot path)."""
    char = array.dtype.char
    try:
        return _DATATYPES[char]
    except KeyError:
        dt = _DATATYPES[char] = mpi_datatype(np.dtype(array.dtype))
        return dt


_REDUCE_ARGS: dict[tuple[ReduceOp, Any], tuple[Any, Any]] = {}


def reduce_args(op: ReduceOp, array: Any) -> tuple[Any, Any]:
    """(MPI datatype, MPI op) for reducing ``array`` with ``op``, cached on (op, dtype)."""
    key = (op, array.dtype)
    try:
        return _REDUCE_ARGS[key]
    except KeyError:
        args = _REDUCE_ARGS[key] = (datatype_of(array), op_for(op, array))
        return args


def op_for(op: ReduceOp, array: Any) -> Any:
    """:func:`mpi_op` through a dict keyed on the (singleton) op's id and the type code."""
    key = (id(op), array.dtype.char)
    try:
        return _OPS[key]
    except KeyError:
        mop = _OPS[key] = mpi_op(op, np.dtype(array.dtype))
        return mop


__all__ = ["datatype_of", "mpi_datatype", "mpi_op", "op_for", "reduce_args"]
