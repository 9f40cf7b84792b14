"""The object collectives' codecs (procgroup.objects, procgroup._safe_pickle): the size
announcements a peer sends are checked before anything is received, and with
``weights_only=True`` a peer's pickle can build plain data only."""

from __future__ import annotations

import collections
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup import _safe_pickle, objects
from procgroup.errors import InvalidArgumentError, PeerError

pytestmark = pytest.mark.unit


class _Group:
    """What the size check needs of a group: this member's rank and the world's numbering."""

    rank = 0

    @staticmethod
    def global_rank(group_rank: int) -> int:
        return group_rank + 10


_plain = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
              st.binary(max_size=8), st.complex_numbers(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3),
                            st.frozensets(st.integers(), max_size=3)),
    max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(_plain, st.integers(2, pickle.HIGHEST_PROTOCOL))
def test_plain_data_round_trips_with_weights_only(obj: object, protocol: int) -> None:
    assert _safe_pickle.loads(pickle.dumps(obj, protocol), weights_only=True) == obj


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex128", "U3", "S2"])
def test_numpy_arrays_and_scalars_round_trip(dtype: str) -> None:
    a = np.arange(6).astype(dtype).reshape(2, 3)
    for obj in (a, a[0, 1], np.dtype(dtype), collections.OrderedDict(x=1, y="b"), range(3), slice(1, 5, 2)):
        got = _safe_pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), weights_only=True)
        assert type(got) is type(obj)
        assert np.array_equal(got, obj) if isinstance(obj, np.ndarray) else got == obj


@pytest.mark.parametrize("obj, named", [
    (os.system, "posix.system"), (collections.Counter("ab"), "collections.Counter"),
    (np.array([object()], dtype=object), "Python objects"), (PeerError("x"), "procgroup.errors.PeerError"),
])
def test_anything_else_is_refused_naming_it(obj: object, named: str) -> None:
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    with pytest.raises(pickle.UnpicklingError, match=named):
        _safe_pickle.loads(data, weights_only=True)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_never_run_code(data: bytes) -> None:
    """Whatever a peer sends, weights_only unpickling builds plain data or refuses it with
    UnpicklingError (any other exception would escape the object collectives' handling)."""
    try:
        _safe_pickle.loads(data, weights_only=True)
    except pickle.UnpicklingError:
        pass


def test_the_flag_must_be_a_bool() -> None:
    assert _safe_pickle.check_flag(True, "op") is True
    with pytest.raises(InvalidArgumentError, match="op: weights_only must be True or False, got 1"):
        _safe_pickle.check_flag(1, "op")


def test_size_announcements_are_checked_before_receiving(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(objects.ENV_MAX_OBJECT_BYTES, "100")
    objects._check_sizes([10, 90], 1, _Group, "gather_object")
    with pytest.raises(PeerError, match="gather_object: rank 11 announced a pickle of -1 bytes, a negative size") as info:
        objects._check_sizes([-1], 1, _Group, "gather_object")
    assert info.value.rank == 11  # named in the world's numbering
    with pytest.raises(PeerError, match="announced pickles of 101 bytes in all, over the limit of 100 bytes"):
        objects._check_sizes([60, 41], 2, _Group, "gather_object")
    with pytest.raises(InvalidArgumentError, match="this rank's objects are a pickle of 101 bytes"):
        objects._check_sizes([101], 0, _Group, "gather_object")
    monkeypatch.setenv(objects.ENV_MAX_OBJECT_BYTES, "lots")
    with pytest.raises(InvalidArgumentError, match=objects.ENV_MAX_OBJECT_BYTES):
        objects.max_object_bytes()


@given(st.lists(st.integers(-2**40, 2**40), max_size=6))
def test_any_announcement_is_accepted_only_within_the_limit(sizes: list[int]) -> None:
    try:
        objects._check_sizes(sizes, 1, _Group, "op")
    except (PeerError, InvalidArgumentError):
        assert any(s < 0 for s in sizes) or sum(max(s, 0) for s in sizes) > objects.max_object_bytes()
        return
    assert all(s >= 0 for s in sizes) and sum(sizes) <= objects.max_object_bytes()


def test_a_refused_object_names_the_sender() -> None:
    buf = np.frombuffer(pickle.dumps(os.system), np.uint8)
    with pytest.raises(PeerError, match="all_gather_object: the object from rank 13 was refused") as info:
        objects._from_bytes(buf, buf.size, True, _Group, 3, "all_gather_object")
    assert info.value.rank == 13


class _ForgedDtype:
    """A dtype pickle whose state puts a field 1 MiB past an 8-byte item (reading it would
    read memory outside the array)."""

    def __reduce__(self) -> tuple:
        return (np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("f8"), 1 << 20)}, 8, 1, 0))


def test_a_forged_dtype_state_is_refused() -> None:
    plain = pickle.dumps(np.frombuffer(b"\1" * 8, dtype=np.uint8), 4)
    assert _safe_pickle.loads(plain, weights_only=True).tolist() == [1] * 8
    with pytest.raises(pickle.UnpicklingError, match="refuses the NumPy dtype"):
        _safe_pickle.loads(pickle.dumps(_ForgedDtype(), 4), weights_only=True)
    for structured in (np.zeros(2, "i4,f8"), np.dtype(("f8", (2,)))):
        with pytest.raises(pickle.UnpicklingError, match="refuses"):
            _safe_pickle.loads(pickle.dumps(structured, 4), weights_only=True)
    with pytest.raises(pickle.UnpicklingError, match="could not build"):
        _safe_pickle.loads(b"\x80\x04garbage", weights_only=True)


class _Reduce:
    """A pickle that calls ``func(*args)`` when unpickled: a few bytes naming a size."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple:
        return (self.func, self.args)


def _reconstruct() -> object:
    try:
        from numpy._core.multiarray import _reconstruct as found  # NumPy 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct as found
    return found


@pytest.mark.parametrize("forged, named", [
    (_Reduce(bytes, 10**12), r"bytes\(\) of 1000000000000 items: it would allocate 1000000000000 bytes"),
    (_Reduce(bytearray, 1001), r"bytearray\(\) of 1001 items: it would allocate 1001 bytes"),
    (_Reduce(list, range(10**12)), r"list\(\) of 1000000000000 items"),
    (_Reduce(frozenset, range(200)), r"frozenset\(\) of 200 items: it would allocate 1600 bytes"),
    (_Reduce(np.ndarray, (10**6, 10**6), "f8"), r"shape \(1000000, 1000000\) and dtype float64: it would allocate"),
    (_Reduce(_reconstruct(), np.ndarray, (126,), "f8"), r"shape \(126,\) and dtype float64: it would allocate 1008"),
    (_Reduce(np.ndarray, (3,), "O"), "Python objects"),
    (_Reduce(_reconstruct(), np.ndarray, (3,), "O"), "Python objects"),
    (_Reduce(_reconstruct(), np.dtype, (1,), "f8"), "refuses to reconstruct"),
])
def test_a_size_named_in_the_pickle_is_checked_before_allocating(
        monkeypatch: pytest.MonkeyPatch, forged: _Reduce, named: str) -> None:
    monkeypatch.setenv(objects.ENV_MAX_OBJECT_BYTES, "1000")
    with pytest.raises(pickle.UnpicklingError, match=named):
        _safe_pickle.loads(pickle.dumps(forged, 4), weights_only=True)
    within = [bytes(1000), bytearray(10), list(range(100)), np.zeros((5, 25)), np.ones(3, "U4")]
    for protocol in (2, 4, 5):
        got = _safe_pickle.loads(pickle.dumps(within, protocol), weights_only=True)
        assert got[:3] == within[:3] and all(np.array_equal(a, b) for a, b in zip(got[3:], within[3:]))
