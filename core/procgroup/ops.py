"""Reduction operators and how each one reduces NumPy (and CuPy) arrays in place."""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from .errors import UnsupportedOperationError


class ReduceOp(enum.Enum):
    """The reduction applied by all_reduce, reduce and reduce_scatter."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    # members are singletons, so identity hashing is exact; Enum's own __hash__ is Python
    # code, and (op, dtype) lookups run on every reducing call
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"


#: torch.distributed's old spelling, kept for scripts written against the seed API.
reduce_op = ReduceOp

_BITWISE = {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}
_ORDERED = {ReduceOp.MIN, ReduceOp.MAX}


_checked: set[tuple[ReduceOp, np.dtype]] = set()


def check_op_dtype(op: ReduceOp, dtype: Any) -> None:
    """Raise a clear error when ``op`` is not defined for ``dtype``; call before sending.

    Combinations that passed once are remembered: this runs on every reducing call.
    """
    try:
        if (op, dtype) in _checked:
            return
    except TypeError:
        pass  # unhashable op: the checks below say what is wrong
    _check_op_dtype(op, dtype)
    _checked.add((op, dtype))


def _check_op_dtype(op: ReduceOp, dtype: Any) -> None:
    if not isinstance(op, ReduceOp):
        raise UnsupportedOperationError(
            f"op must be a procgroup.ReduceOp, got {op!r} ({type(op).__name__})"
        )
    dt = np.dtype(dtype)
    kind = dt.kind  # b bool, i/u int, f float, c complex
    if kind not in "biufc":
        raise UnsupportedOperationError(f"{op.name} is not defined for dtype {dt}")
    if op in _BITWISE and kind not in "biu":
        raise UnsupportedOperationError(
            f"{op.name} is a bitwise op and needs an integer or bool dtype, not {dt}"
        )
    if op in _ORDERED and kind == "c":
        raise UnsupportedOperationError(f"{op.name} is not defined for complex dtype {dt}")
    if op is ReduceOp.AVG and kind not in "fc":
        raise UnsupportedOperationError(
            f"AVG needs a floating or complex dtype (an integer average would be "
            f"truncated), not {dt}; use SUM and divide"
        )


_BOOL_UFUNCS = {
    # numpy's add/multiply on bool already act as logical or/and; keep it explicit
    ReduceOp.SUM: np.logical_or,
    ReduceOp.PRODUCT: np.logical_and,
    ReduceOp.MIN: np.logical_and,
    ReduceOp.MAX: np.logical_or,
    ReduceOp.BAND: np.logical_and,
    ReduceOp.BOR: np.logical_or,
    ReduceOp.BXOR: np.logical_xor,
}
_UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVG: np.add,  # summed during the exchange, divided once at the end
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
}


def reduce_into(op: ReduceOp, acc: np.ndarray, other: np.ndarray) -> None:
    """``acc = op(acc, other)`` elementwise, in place, no temporaries.

    Works for CuPy arrays too: CuPy's ufuncs accept ``out=`` the same way.
    """
    ufunc = _BOOL_UFUNCS[op] if acc.dtype.kind == "b" else _UFUNCS[op]
    ufunc(acc, other, out=acc)


def finish_average(op: ReduceOp, acc: np.ndarray, count: int) -> None:
    """Turn the SUM computed for AVG into the mean over ``count`` ranks, in place."""
    if op is ReduceOp.AVG and count > 1:
        acc /= count


__all__ = ["ReduceOp", "check_op_dtype", "finish_average", "reduce_into", "reduce_op"]
