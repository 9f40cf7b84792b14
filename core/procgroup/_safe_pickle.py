"""The object collectives' ``weights_only=True``: an unpickler that builds plain data only.

torch's ``weights_only`` restricts what ``torch.load`` may build; procgroup gives the
object collectives' flag the same purpose: what peers send is unpickled, and a pickle can
call any importable function. With ``weights_only=True`` only these are built: None,
bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set, frozenset,
slice, range, collections.OrderedDict, NumPy arrays of numeric/bool/str/bytes dtypes,
NumPy scalars and dtypes. Anything else (a class, a function, an object-dtype array) is
refused with :class:`~procgroup.errors.PeerError` naming what the sender tried to build.
"""

from __future__ import annotations

import _compat_pickle
import collections
import io
import pickle
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

_BUILTINS = {
    "builtins": {"complex", "set", "frozenset", "bytearray", "slice", "range", "bytes", "int", "float",
                 "str", "bool", "tuple", "list", "dict"},
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


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The NumPy callables an ndarray/dtype/scalar pickle names, under both module paths
    (numpy.core before NumPy 2, numpy._core after; a peer may run either)."""
    import importlib

    try:
        core = importlib.import_module("numpy._core")  # NumPy 2
    except ImportError:
        core = importlib.import_module("numpy.core")
    multiarray, numeric = core.multiarray, core.numeric
    allowed: dict[tuple[str, str], Any] = {("numpy", "dtype"): _plain_dtype, ("numpy", "ndarray"): np.ndarray}
    for mod in ("numpy.core", "numpy._core"):
        allowed[(mod + ".multiarray", "_reconstruct")] = multiarray._reconstruct
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

    dispatch[pickle.BUILD[0]] = _load_checked_build

    def find_class(self, module: str, name: str) -> Any:
        # protocols 0-2 name Python 2's modules (what Unpickler's fix_imports maps)
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
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
