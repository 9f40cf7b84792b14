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


def _plain_dtype(*args: Any) -> np.dtype:
    """numpy.dtype, refusing object dtypes (their items would be arbitrary objects)."""
    dt = np.dtype(*args)
    if dt.hasobject:
        raise pickle.UnpicklingError("weights_only=True refuses a NumPy array or dtype of Python objects")
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


class PlainDataUnpickler(pickle.Unpickler):
    """Builds only what the module docstring lists; find_class refuses the rest."""

    _numpy: dict[tuple[str, str], Any] | None = None

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
    return PlainDataUnpickler(io.BytesIO(data)).load()


def check_flag(weights_only: Any, op: str) -> bool:
    if not isinstance(weights_only, bool):
        raise InvalidArgumentError(f"{op}: weights_only must be True or False, got {weights_only!r}")
    return weights_only


__all__ = ["PlainDataUnpickler", "check_flag", "loads"]
