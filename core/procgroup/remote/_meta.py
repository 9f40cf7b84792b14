"""Shape and dtype of every remote result, computed on the master before anything is sent.

The method, cheap and exact:

- dtypes (and NumPy's type errors, overflow of Python ints, casting errors) come from
  running the very NumPy call on *tiny* stand-ins: 1-element arrays of the operands'
  dtypes, with Python scalars passed as they are (so NEP 50's weak scalars behave the same);
- shapes come from NumPy's rules (``np.broadcast_shapes``, axis normalisation, the
  matmul/dot/concatenate rules) in O(ndim);
- when a rule finds a mistake, the NumPy call runs once more on *ghosts*: zero-stride,
  read-only views of one element with the operands' real shapes. NumPy checks shapes
  before it allocates or computes, so it raises its own exception, with its own message,
  at no cost. View-producing calls (reshape, transpose, basic indexing, ...) simply run on
  the ghost: a view of a ghost costs nothing and has the exact shape.
"""

from __future__ import annotations

import importlib
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

try:
    _axis_utils: Any = importlib.import_module("numpy.lib.array_utils")
except ImportError:  # NumPy < 2 keeps it in numpy.core.numeric
    _axis_utils = importlib.import_module("numpy.core.numeric")


def normalize_axis_tuple(axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (an int or a sequence of ints) as non-negative axes of ``ndim`` dimensions,
    with NumPy's own errors (NumPy's function; its stubs differ between NumPy releases)."""
    return tuple(int(a) for a in _axis_utils.normalize_axis_tuple(axis, ndim))


_as_strided = np.lib.stride_tricks.as_strided
_MAX_BYTES = np.iinfo(np.intp).max


class AbstractArray:
    """Something with a shape and a dtype but no data here (RemoteArray derives from it)."""

    __slots__ = ()
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def is_abstract(x: Any) -> bool:
    return isinstance(x, AbstractArray)


def shape_of(x: Any) -> tuple[int, ...]:
    return x.shape if isinstance(x, AbstractArray) else np.shape(x)


def tiny(x: Any, ndim: int | None = None) -> Any:
    """A 1-element stand-in with x's dtype (Python scalars stay themselves)."""
    if isinstance(x, AbstractArray):
        return np.ones((1,) * (x.ndim if ndim is None else ndim), x.dtype)
    if isinstance(x, np.ndarray):
        return np.ones((1,) * (x.ndim if ndim is None else ndim), x.dtype)
    return x


def ghost(x: Any, writeable: bool = False) -> Any:
    """A zero-stride view of one element with x's real shape (x itself if local)."""
    if isinstance(x, AbstractArray):
        return _as_strided(np.zeros(1, x.dtype), shape=x.shape, strides=(0,) * x.ndim, writeable=writeable)
    return x


def _map(fn: Callable[[Any], Any], obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    return fn(obj)


def ghosts(obj: Any) -> Any:
    return _map(ghost, obj)


def normalize_shape(shape: Any, where: str = "shape") -> tuple[int, ...]:
    """An int or a sequence of ints, as NumPy takes it; NumPy's errors otherwise."""
    try:
        dims: tuple[int, ...] = (operator.index(shape),)
    except TypeError:
        try:
            dims = tuple(operator.index(d) for d in shape)
        except TypeError:
            raise TypeError(f"{where}: expected a sequence of integers or a single integer, "
                            f"got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError("negative dimensions are not allowed")
    return dims


def check_alloc(shape: tuple[int, ...], dtype: np.dtype) -> None:
    if math.prod(shape) * dtype.itemsize > _MAX_BYTES:
        raise ValueError("array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size.")


# --------------------------------------------------------------------- ufuncs
def _dtypes(res: Any) -> tuple[np.dtype, ...]:
    if isinstance(res, tuple):
        return tuple(np.asarray(r).dtype for r in res)
    return (np.asarray(res).dtype,)


_CACHE: dict[Any, Any] = {}
_CACHE_MAX = 4096


def _sig(x: Any) -> Any:
    """What decides a ufunc's result for operand x: shape and dtype (arrays), the value
    for Python ints (NumPy 2 refuses out-of-range ints), the type for other scalars."""
    if isinstance(x, AbstractArray):
        return (x.shape, x.dtype)
    if isinstance(x, int):
        return (type(x), x)
    if isinstance(x, (float, complex, np.generic)):
        return type(x)
    return None


def ufunc_call(ufunc: np.ufunc, inputs: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], tuple[np.dtype, ...]]:
    """(shape, output dtypes) of ``ufunc(*inputs, **kwargs)``, cached for plain operands."""
    key: Any = None
    if len(kwargs) <= 1:
        sigs = tuple(_sig(x) for x in inputs)
        if None not in sigs:
            outs = kwargs.get("out")
            if not kwargs:
                key = (ufunc, sigs)
            elif outs is not None and all(isinstance(o, AbstractArray) for o in outs):
                key = (ufunc, sigs, tuple((o.shape, o.dtype) for o in outs))
    if key is not None:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit
    result = _ufunc_call(ufunc, inputs, kwargs)
    if key is not None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = result
    return result


def _ufunc_call(ufunc: np.ufunc, inputs: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], tuple[np.dtype, ...]]:
    if ufunc.signature is not None:
        if ufunc is np.matmul:
            return matmul(inputs[0], inputs[1], kwargs)
        raise TypeError(f"procgroup.remote: the generalized ufunc {ufunc.__name__} is not supported on RemoteArray")
    outs = kwargs.get("out") or ()
    with np.errstate(all="ignore"):
        tk = dict(kwargs)
        if outs:
            tk["out"] = tuple(np.ones(1, o.dtype) if o is not None else None for o in outs)
        if "where" in tk:
            tk["where"] = tiny(tk["where"])
        res = ufunc(*[tiny(x, 1 if shape_of(x) else 0) for x in inputs], **tk)
    dts = _dtypes(res)
    shapes = [shape_of(x) for x in inputs]
    if "where" in kwargs:
        shapes.append(shape_of(kwargs["where"]))
    first = shapes[0]
    try:
        shape = first if all(s == first for s in shapes) else np.broadcast_shapes(*shapes)
        for o in outs:
            if o is not None and o.shape != shape and np.broadcast_shapes(shape, o.shape) != o.shape:
                raise ValueError("out")
        if outs and outs[0] is not None:
            shape = outs[0].shape
    except ValueError:
        _raise_like(lambda: ufunc(*ghosts(list(inputs)), **_ghost_kwargs(kwargs, writeable_out=True)))
        raise
    return shape, dts


def _ghost_kwargs(kwargs: dict[str, Any], writeable_out: bool = False) -> dict[str, Any]:
    gk = dict(kwargs)
    if gk.get("out"):
        gk["out"] = tuple(None if o is None else ghost(o, writeable=writeable_out) for o in gk["out"])
    if "where" in gk:
        gk["where"] = ghost(gk["where"])
    return gk


def _raise_like(call: Callable[[], Any]) -> None:
    """Run ``call`` on ghosts: NumPy raises its own error (before computing anything)."""
    with np.errstate(all="ignore"):
        call()


def reduce_shape(shape: tuple[int, ...], axis: Any, keepdims: bool) -> tuple[int, ...]:
    ndim = len(shape)
    axes = tuple(range(ndim)) if axis is None else normalize_axis_tuple(axis, ndim)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def small(x: AbstractArray) -> np.ndarray:
    """x's ndim and its zero dims, 1 elsewhere: reductions raise NumPy's own errors on it
    (empty reductions, bad axes) and give the result dtype."""
    return np.ones(tuple(0 if d == 0 else 1 for d in x.shape), x.dtype)


def ufunc_reduce(ufunc: np.ufunc, method: str, x: AbstractArray, kwargs: dict[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """np.<ufunc>.reduce / accumulate on x."""
    k = {key: v for key, v in kwargs.items() if key != "out"}
    if "where" in k:
        k["where"] = tiny(k["where"])
    if "initial" in k and is_abstract(k["initial"]):
        raise TypeError("initial must be a scalar, not a RemoteArray")
    with np.errstate(all="ignore"):
        res = getattr(ufunc, method)(small(x), **k)
    dtype = np.asarray(res).dtype
    if method == "accumulate":
        shape = x.shape
    else:
        shape = reduce_shape(x.shape, kwargs.get("axis", 0), bool(kwargs.get("keepdims", False)))
    _check_out(kwargs, shape)
    return shape, dtype


def _check_out(kwargs: dict[str, Any], shape: tuple[int, ...]) -> None:
    outs = kwargs.get("out") or ()
    if not isinstance(outs, tuple):
        outs = (outs,)
    for o in outs:
        if o is not None and tuple(o.shape) != tuple(shape):
            raise ValueError(f"output parameter has the wrong shape: expected {shape}, got {o.shape}")


# --------------------------------------------------------------------- functions
def reduction(func: Callable[..., Any], x: AbstractArray, kwargs: dict[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """sum/prod/mean/std/var/max/min/any/all/argmax/argmin/cumsum/cumprod/... of x."""
    k = {key: v for key, v in kwargs.items() if key != "out"}
    with np.errstate(all="ignore"), _quiet():
        res = func(small(x), **k)
    dtype = np.asarray(res).dtype
    name = func.__name__
    axis = kwargs.get("axis")
    if name in ("cumsum", "cumprod", "nancumsum", "nancumprod"):
        shape = (x.size,) if axis is None else x.shape
    else:
        shape = reduce_shape(x.shape, axis, bool(kwargs.get("keepdims", False)))
    _check_out(kwargs, shape)
    return shape, dtype


class _quiet:
    """Silence the RuntimeWarnings NumPy gives for stand-ins (mean of an empty slice)."""

    def __enter__(self) -> None:
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


def on_ghosts(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """For view-producing calls (reshape, transpose, basic indexing): run on ghosts."""
    res = func(*ghosts(list(args)), **ghosts(kwargs))
    return np.shape(res), np.asarray(res).dtype if not isinstance(res, np.ndarray) else res.dtype


def matmul(a: Any, b: Any, kwargs: dict[str, Any] | None = None) -> tuple[tuple[int, ...], tuple[np.dtype, ...]]:
    kwargs = kwargs or {}
    sa, sb = shape_of(a), shape_of(b)
    ok = len(sa) >= 1 and len(sb) >= 1
    if ok:
        a2 = (1,) + sa if len(sa) == 1 else sa
        b2 = sb + (1,) if len(sb) == 1 else sb
        ok = a2[-1] == b2[-2]
    if ok:
        try:
            batch = np.broadcast_shapes(a2[:-2], b2[:-2])
        except ValueError:
            ok = False
    if not ok:
        _raise_like(lambda: np.matmul(ghost(a), ghost(b)))
        raise ValueError(f"matmul: shapes {sa} and {sb} do not match")
    shape = tuple(batch) + (() if len(sa) == 1 else (a2[-2],)) + (() if len(sb) == 1 else (b2[-1],))
    tk = {k: v for k, v in kwargs.items() if k not in ("out",)}
    res = np.matmul(tiny(a, 2), tiny(b, 2), **tk)
    _check_out(kwargs, shape)
    return shape, (res.dtype,)


def dot(a: Any, b: Any) -> tuple[tuple[int, ...], np.dtype]:
    sa, sb = shape_of(a), shape_of(b)
    with np.errstate(all="ignore"):
        dtype = np.asarray(np.dot(tiny(a, min(len(sa), 2)), tiny(b, min(len(sb), 2)))).dtype
    if not sa or not sb:
        return (sb if not sa else sa), dtype
    k_b = sb[0] if len(sb) == 1 else sb[-2]
    if sa[-1] != k_b:
        _raise_like(lambda: np.dot(ghost(a), ghost(b)))
        raise ValueError(f"shapes {sa} and {sb} not aligned")
    if len(sb) == 1:
        return sa[:-1], dtype
    return sa[:-1] + sb[:-2] + sb[-1:], dtype


def outer(a: Any, b: Any) -> tuple[tuple[int, ...], np.dtype]:
    res = np.outer(tiny(a), tiny(b))
    return (int(np.prod(shape_of(a))), int(np.prod(shape_of(b)))), res.dtype


def concatenate(arrays: Sequence[Any], axis: Any = 0, dtype: Any = None, casting: str = "same_kind",
                stack: bool = False) -> tuple[tuple[int, ...], np.dtype]:
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    shapes = [shape_of(a) for a in arrays]
    fn = np.stack if stack else np.concatenate
    kw: dict[str, Any] = {"axis": axis}
    if dtype is not None:
        kw["dtype"] = dtype
    if casting != "same_kind":
        kw["casting"] = casting
    ndim = len(shapes[0])
    try:
        if stack:
            if any(s != shapes[0] for s in shapes):
                raise ValueError("shape")
            (ax,) = normalize_axis_tuple(axis, ndim + 1)
            shape = shapes[0][:ax] + (len(arrays),) + shapes[0][ax:]
            res = fn([tiny(a, ndim) for a in arrays], **kw)
        elif axis is None:
            shape = (sum(int(np.prod(s)) for s in shapes),)
            res = fn([tiny(a) for a in arrays], **kw)
        else:
            if ndim == 0 or any(len(s) != ndim for s in shapes):
                raise ValueError("ndim")
            (ax,) = normalize_axis_tuple(axis, ndim)
            if any(s[:ax] + s[ax + 1:] != shapes[0][:ax] + shapes[0][ax + 1:] for s in shapes):
                raise ValueError("shape")
            shape = shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1:]
            res = fn([tiny(a, ndim) for a in arrays], **kw)
    except ValueError:  # AxisError is a ValueError too
        _raise_like(lambda: fn([ghost(a) for a in arrays], **kw))
        raise
    return shape, res.dtype


def broadcast_meta(func: Callable[..., Any], operands: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """Element-wise functions that are not ufuncs for __array_ufunc__ (where, clip)."""
    with np.errstate(all="ignore"):
        res = func(*[tiny(x, 1) for x in operands], **{k: tiny(v) for k, v in kwargs.items() if k != "out"})
    shapes = [shape_of(x) for x in operands if x is not None]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        _raise_like(lambda: func(*ghosts(list(operands)), **{k: v for k, v in kwargs.items() if k != "out"}))
        raise
    _check_out(kwargs, shape)
    return shape, np.asarray(res).dtype


# --------------------------------------------------------------------- indexing
def getitem(x: AbstractArray, key: Any) -> tuple[tuple[int, ...], np.dtype]:
    if _has_remote_bool(key):
        raise TypeError("procgroup.remote: indexing with a boolean RemoteArray has a data-dependent shape; "
                        "use np.where(mask, x, fill), or index with mask.get() (a local mask)")
    res = ghost(x)[_key_ghosts(key)]
    return np.shape(res), x.dtype


def _key_ghosts(key: Any) -> Any:
    if isinstance(key, tuple):
        return tuple(_key_ghost(k) for k in key)
    return _key_ghost(key)


def _key_ghost(k: Any) -> Any:
    if isinstance(k, AbstractArray):
        return np.zeros(k.shape, k.dtype)  # an index array: the result has its shape
    return k


def _has_remote_bool(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, AbstractArray) and k.dtype == np.bool_ for k in keys)


def setitem(x: AbstractArray, key: Any, value: Any) -> None:
    """Raise what ``x[key] = value`` would raise in NumPy; return when it is fine."""
    if _has_remote_bool(key):
        raise TypeError("procgroup.remote: assignment through a boolean RemoteArray mask is not supported; "
                        "use np.where or np.copyto(x, value, where=mask)")
    view = ghost(x)[_key_ghosts(key)]
    vshape = shape_of(value)
    ok = True
    try:
        ok = np.broadcast_shapes(vshape, np.shape(view)) == np.shape(view)
    except ValueError:
        ok = False
    if not ok:
        target = ghost(x, writeable=True)
        target[_key_ghosts(key)] = ghost(value) if is_abstract(value) else value
        raise ValueError(f"could not broadcast input array from shape {vshape} into shape {np.shape(view)}")
    if not is_abstract(value) and not isinstance(value, np.ndarray):
        np.zeros(1, x.dtype)[0:1] = value  # NumPy's conversion errors (overflow, strings, ...)
    elif not is_abstract(value):
        np.zeros(1, x.dtype)[0:1] = np.asarray(value).reshape(-1)[:1] if np.size(value) else np.zeros(1, x.dtype)


def astype(x: AbstractArray, dtype: Any) -> np.dtype:
    return np.ones(1, x.dtype).astype(dtype).dtype


# --------------------------------------------------------------------- constructors
def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> tuple[tuple[int, ...], np.dtype]:
    if stop is None:
        start, stop = 0, start
    if step is None:
        step = 1
    for v in (start, stop, step):
        if isinstance(v, AbstractArray):
            raise TypeError("arange: start, stop and step must be scalars, not RemoteArrays")
    if step == 0:
        np.arange(start, stop, step)  # NumPy's own error
        raise ZeroDivisionError("arange: step is 0")

    def zero(v: Any) -> Any:
        return type(v)(0) if not isinstance(v, bool) else 0

    dt = np.arange(zero(start), zero(stop), type(step)(1) if not isinstance(step, bool) else 1,
                   dtype=dtype).dtype
    length = max(0, math.ceil((stop - start) / step))
    if dt.kind in "iu" and length:  # NumPy computes ints exactly
        length = len(range(int(start), int(stop), int(step))) if all(float(v).is_integer() for v in (start, stop, step)) else length
    return (int(length),), dt


def full_dtype(fill_value: Any, dtype: Any) -> np.dtype:
    if isinstance(fill_value, AbstractArray):
        raise TypeError("full: fill_value must be a scalar or a local array, not a RemoteArray")
    # an empty array with the fill value's own shape last: NumPy's conversion errors, no cost
    return np.full((0, *np.shape(fill_value)), fill_value, dtype=dtype).dtype \
        if dtype is not None or np.ndim(fill_value) == 0 else np.asarray(fill_value).dtype


__all__ = [
    "AbstractArray", "arange", "astype", "broadcast_meta", "check_alloc", "concatenate", "dot", "full_dtype",
    "getitem", "ghost", "is_abstract", "matmul", "normalize_shape", "on_ghosts", "outer", "reduce_shape",
    "reduction", "setitem", "shape_of", "tiny", "ufunc_call", "ufunc_reduce",
]
