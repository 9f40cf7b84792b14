"""The object collectives' ``weights_only=True``: an unpickler that builds plain data only.

torch's ``weights_only`` restricts what ``torch.load`` may build; procgroup gives the
object collectives' flag the same purpose: what peers send is unpickled, and a pickle can
call any importable function. With ``weights_only=True`` only these are built: None,
bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset,
slice, range, collections.OrderedDict, NumPy arrays of numeric/bool/str/bytes dtypes,
NumPy scalars and dtypes. Anything else (a class, a function, an object-dtype array) is
refused with :class:`~procgroup.errors.PeerError` naming what the sender tried to build.

A few bytes of pickle can name a size instead of carrying the data (``bytes(N)``,
``bytearray(N)``, ``list(range(N))``, ``numpy.ndarray(shape)``, numpy's ``_reconstruct``):
what these would allocate is checked first against the object collectives' limit
(:func:`procgroup.objects.max_object_bytes`) and refused over it.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import math
import operator
import os
import pickle
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

_BUILTINS = {
    "builtins": {"complex", "slice", "range", "int", "float", "str", "bool", "dict"},
    "collections": {"OrderedDict"},
    "_codecs": {"encode"},  # how protocol 2 pickles bytes
}


def _check_dtype(dt: np.dtype) -> None:
    """Refuse object dtypes (their items would be arbitrary objects) and any dtype whose
    layout differs from the one NumPy builds from its name: a pickled dtype's state sets
    fields, offsets, item size and flags unchecked, and a field offset past the item size
    reads memory outside the array."""
    if dt.hasobject:
        raise pickle.UnpicklingError("weights_only=True refuses a NumPy array or dtype of Python objects")
    canonical = np.dtype(dt.str)
    if (dt.kind not in "biufcSUVmM" or dt.fields is not None or dt.subdtype is not None
            or dt.itemsize != canonical.itemsize or dt.flags != canonical.flags):
        raise pickle.UnpicklingError(f"weights_only=True refuses the NumPy dtype {dt!r}: only numeric, bool, "
                                     f"str, bytes and datetime dtypes without fields are allowed")


def _plain_dtype(obj: Any, align: bool = False, copy: bool = True) -> np.dtype:
    """numpy.dtype, always a copy (a later BUILD would otherwise set the state of NumPy's
    shared dtype), refusing what :func:`_check_dtype` refuses."""
    dt = np.dtype(obj, bool(align), True)
    _check_dtype(dt)
    return dt


ENV_MAX_OBJECT_BYTES = "PROCGROUP_MAX_OBJECT_BYTES"
DEFAULT_MAX_OBJECT_BYTES = 2**32


def max_object_bytes() -> int:
    """$PROCGROUP_MAX_OBJECT_BYTES, else 4 GiB."""
    raw = os.environ.get(ENV_MAX_OBJECT_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_OBJECT_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise InvalidArgumentError(f"environment variable {ENV_MAX_OBJECT_BYTES}={raw!r}: expected a positive "
                                   f"number of bytes")
    return value


def _check_size(nbytes: int, what: str) -> None:
    """Refuse building ``what`` when it would take over the object collectives' limit: the
    size comes from the peer's pickle, not from data it sent."""
    limit = max_object_bytes()
    if nbytes > limit:
        raise pickle.UnpicklingError(f"weights_only=True refuses {what}: it would allocate {nbytes} bytes, over "
                                     f"the limit of {limit} bytes ({ENV_MAX_OBJECT_BYTES})")


#: the builtins whose argument may be a count or a lazy range, and the least bytes one
#: element they build takes (a pointer for the containers)
_SIZED_BUILTINS = {"bytes": 1, "bytearray": 1, "list": 8, "tuple": 8, "set": 8, "frozenset": 8}


def _sized_builtin(name: str) -> Any:
    """``builtins.<name>`` refusing a count or range argument over the size limit."""
    import builtins

    build = getattr(builtins, name)
    per_item = _SIZED_BUILTINS[name]

    def checked(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], (int, range)):
            count = len(args[0]) if isinstance(args[0], range) else int(args[0])
            _check_size(count * per_item, f"{name}() of {count} items")
        return build(*args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    return checked


def _array_bytes(shape: Any, dtype: Any) -> tuple[int, np.dtype]:
    """The bytes an array of ``shape`` and ``dtype`` takes (exact Python ints: no overflow),
    and the checked dtype."""
    dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
    _check_dtype(dt)
    dims = [operator.index(shape)] if not isinstance(shape, (tuple, list)) else [operator.index(d) for d in shape]
    if any(d < 0 for d in dims):
        raise pickle.UnpicklingError(f"weights_only=True refuses the array shape {tuple(dims)}: negative dimension")
    return math.prod(dims) * dt.itemsize, dt


def _checked_ndarray(shape: Any, dtype: Any = float, *args: Any, **kwargs: Any) -> np.ndarray:
    """numpy.ndarray(shape, dtype, ...) refusing object dtypes and sizes over the limit."""
    nbytes, dt = _array_bytes(shape, dtype)
    _check_size(nbytes, f"a NumPy array of shape {shape!r} and dtype {dt}")
    out = np.ndarray(shape, dt, *args, **kwargs)
    _check_dtype(out.dtype)
    return out


def _checked_reconstruct(build: Any) -> Any:
    """numpy's _reconstruct(subtype, shape, dtype) for plain ndarrays only, refusing object
    dtypes and sizes over the limit (the BUILD that follows is checked too)."""

    def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        if subtype is not _checked_ndarray and subtype is not np.ndarray:
            raise pickle.UnpicklingError(f"weights_only=True refuses to reconstruct {subtype!r}: only "
                                         f"numpy.ndarray is allowed")
        nbytes, dt = _array_bytes(shape, dtype)
        _check_size(nbytes, f"a NumPy array of shape {shape!r} and dtype {dt}")
        out = build(np.ndarray, shape, dt)
        _check_dtype(out.dtype)
        return out

    return _reconstruct


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The NumPy callables an ndarray/dtype/scalar pickle names, under both module paths
    (numpy.core before NumPy 2, numpy._core after; a peer may run either)."""
    import importlib

    try:
        core = importlib.import_module("numpy._core")  # NumPy 2
    except ImportError:
        core = importlib.import_module("numpy.core")
    multiarray, numeric = core.multiarray, core.numeric
    allowed: dict[tuple[str, str], Any] = {("numpy", "dtype"): _plain_dtype, ("numpy", "ndarray"): _checked_ndarray}
    reconstruct = _checked_reconstruct(multiarray._reconstruct)
    for mod in ("numpy.core", "numpy._core"):
        allowed[(mod + ".multiarray", "_reconstruct")] = reconstruct
        allowed[(mod + ".multiarray", "scalar")] = multiarray.scalar
        allowed[(mod + ".numeric", "_frombuffer")] = numeric._frombuffer
    return allowed


#: the pure-Python unpickler: its BUILD can be replaced (the C one's cannot)
_PyUnpickler: Any = pickle._Unpickler


class PlainDataUnpickler(_PyUnpickler):
    """Builds only what the module docstring lists; find_class refuses the rest, and a
    BUILD (``__setstate__``) on a dtype or array is checked right after it ran."""

    _numpy: dict[tuple[str, str], Any] | None = None
    dispatch = dict(_PyUnpickler.dispatch)  # copied, one entry replaced below

    def _load_checked_build(self) -> None:
        inst = self.stack[-2]
        _PyUnpickler.dispatch[pickle.BUILD[0]](self)  # the stock BUILD
        if isinstance(inst, np.dtype):
            _check_dtype(inst)
        elif isinstance(inst, (np.ndarray, np.generic)):
            _check_dtype(inst.dtype)
            _check_size(inst.nbytes, f"a NumPy array of shape {inst.shape} and dtype {inst.dtype}")

    dispatch[pickle.BUILD[0]] = _load_checked_build

    def find_class(self, module: str, name: str) -> Any:
        # protocols 0-2 name Python 2's modules (what Unpickler's fix_imports maps)
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if module == "builtins" and name in _SIZED_BUILTINS:
            return _sized_builtin(name)
        if name in _BUILTINS.get(module, ()):
            if module == "collections":
                return collections.OrderedDict
            return super().find_class(module, name)
        if PlainDataUnpickler._numpy is None:
            PlainDataUnpickler._numpy = _numpy_globals()
        found = PlainDataUnpickler._numpy.get((module, name))
        if found is not None:
            return found
        raise pickle.UnpicklingError(f"weights_only=True refuses to build {module}.{name}: only plain data "
                                     f"(containers, numbers, str, bytes, NumPy arrays and dtypes) is allowed")


def loads(data: bytes, weights_only: bool) -> Any:
    """Unpickle ``data``; restricted to plain data when ``weights_only``."""
    if not weights_only:
        return pickle.loads(data)
    try:
        return PlainDataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError:
        raise
    except Exception as exc:  # noqa: BLE001 - malformed data (EOFError, ValueError, ...) is a refusal too
        raise pickle.UnpicklingError(f"weights_only=True could not build the data: {type(exc).__name__}: {exc}") from None


def check_flag(weights_only: Any, op: str) -> bool:
    if not isinstance(weights_only, bool):
        raise InvalidArgumentError(f"{op}: weights_only must be True or False, got {weights_only!r}")
    return weights_only


__all__ = ["PlainDataUnpickler", "check_flag", "loads"]
