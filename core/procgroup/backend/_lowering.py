"""Reductions lowered onto a backend's types and ops, from tables the backend declares.

Each backend fills in a :class:`ReduceTable`: which NumPy dtypes it reduces natively
(dtype name -> its own type), which ReduceOps (-> its own op), and how it treats bool
and complex. The table turns (dtype, ReduceOp) into a :class:`Lowered` plan, or None
with a reason, the same way for every backend:

- bool travels as 0/1 bytes (``bool_as``), so OR = MAX and AND = MIN (``bool_ops``);
- complex SUM/AVG reduce as the float array of twice the length (parts are independent);
- AVG is the backend's own average when it has one (``ops[AVG]``), else SUM then one
  division by the group size (``Lowered.divide``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import UnsupportedOperationError
from ..ops import ReduceOp

_COMPLEX_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVG})


@dataclass(frozen=True)
class Lowered:
    """How to run one reduction: view the array as ``view``, reduce ``dtype`` with ``op``."""

    dtype: Any  # the backend's type
    op: Any  # the backend's reduction
    view: np.dtype | None  # reinterpret the array first (bool -> uint8, complex -> floats)
    divide: bool  # AVG done as SUM: divide by the group size afterwards
    factor: int = 1  # backend elements per array element (2 for complex as float pairs)


def _resolve_identity(value: Any) -> Any:
    return value


@dataclass(frozen=True, eq=False)  # hashed by identity: one table per backend, cached plans
class ReduceTable:
    """A backend's reductions, declared; see the module docstring."""

    backend: str
    #: NumPy dtype name -> the backend's type, for the dtypes it reduces natively.
    dtypes: Mapping[str, Any]
    #: ReduceOp -> the backend's op, for numeric dtypes (AVG here: a native average).
    ops: Mapping[ReduceOp, Any]
    #: ReduceOp -> the backend's op on bool arrays viewed as ``bool_as`` 0/1 values.
    bool_ops: Mapping[ReduceOp, Any] = field(default_factory=dict)
    #: The dtype name bool arrays travel as (a key of ``dtypes``).
    bool_as: str = "uint8"
    #: Ops that reduce complex arrays as pairs of floats (parts independent).
    complex_ops: frozenset[ReduceOp] = _COMPLEX_OPS
    #: Per-dtype op overrides, e.g. MPI's user-defined float16 reductions.
    ops_by_dtype: Mapping[str, Mapping[ReduceOp, Any]] = field(default_factory=dict)
    #: Turns a table entry into the backend's constant when the op runs (e.g. a name
    #: looked up in a library imported lazily); entries are used as they are by default.
    resolve: Callable[[Any], Any] = _resolve_identity

    def __post_init__(self) -> None:
        object.__setattr__(self, "_plans", {})

    def lower(self, dtype: Any, op: ReduceOp) -> Lowered | None:
        """The plan for reducing ``dtype`` with ``op``, or None when the backend cannot.

        Cached per table on (dtype, op) as given: it runs on every reducing call.
        """
        plans: dict[tuple[Any, ReduceOp], Lowered | None] = self._plans  # type: ignore[attr-defined]  # set in __post_init__
        try:
            return plans[dtype, op]
        except KeyError:
            plan = plans[dtype, op] = _lower(self, np.dtype(dtype), op)
            return plan
        except TypeError:  # an unhashable dtype-like
            return _lower(self, np.dtype(dtype), op)

    def why_not(self, dtype: Any, op: ReduceOp) -> str:
        """Why :meth:`lower` returned None, in words for an error message."""
        dt = np.dtype(dtype)
        if dt.kind == "b":
            return f"it has no logical {op.name} for bool; use an integer array"
        if dt.kind == "c" and op not in self.complex_ops:
            ops = ", ".join(o.name for o in sorted(self.complex_ops, key=lambda o: o.name))
            return f"complex arrays reduce as (real, imag) float pairs, which only {ops} allow"
        if dt.name not in self.dtypes and dt.kind != "c":
            supported = ", ".join([*self.dtypes, "bool", "complex64", "complex128"])
            return f"it reduces only {supported}; convert the array (e.g. int16 -> int32)"
        return f"it has no {op.name} reduction for {dt}"

    def require(self, dtype: Any, op: ReduceOp, collective: str, device: str = "cpu") -> Lowered:
        """:meth:`lower`, or an UnsupportedOperationError naming backend, op, dtype and device."""
        plan = self.lower(dtype, op)
        if plan is None:
            raise UnsupportedOperationError(
                f"{collective}: backend {self.backend!r} cannot apply {op.name} to dtype "
                f"{np.dtype(dtype)} on {device}: {self.why_not(dtype, op)}"
            )
        return plan


def _lower(table: ReduceTable, dt: np.dtype, op: ReduceOp) -> Lowered | None:
    if not dt.isnative:
        return None
    resolve = table.resolve
    if dt.kind == "b":
        if op not in table.bool_ops or table.bool_as not in table.dtypes:
            return None
        return Lowered(resolve(table.dtypes[table.bool_as]), resolve(table.bool_ops[op]),
                       np.dtype(table.bool_as), False)
    view: np.dtype | None = None
    factor = 1
    name = dt.name
    if dt.kind == "c":
        if op not in table.complex_ops:
            return None
        view = np.dtype(f"f{dt.itemsize // 2}")
        name, factor = view.name, 2
    if name not in table.dtypes:
        return None
    ops = table.ops_by_dtype.get(name, table.ops)
    divide = False
    if op is ReduceOp.AVG and ReduceOp.AVG not in ops:
        op, divide = ReduceOp.SUM, True
    if op not in ops:
        return None
    return Lowered(resolve(table.dtypes[name]), resolve(ops[op]), view, divide, factor)


def flat_view(array: Any, view: np.dtype | None) -> Any:
    """A 1-d view of a C-contiguous array, reinterpreted as ``view`` when given; no copy."""
    out = array.reshape(-1)
    return out if view is None or view == out.dtype else out.view(view)


__all__ = ["Lowered", "ReduceTable", "flat_view"]
