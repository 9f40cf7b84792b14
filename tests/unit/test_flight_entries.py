"""The flight recorder's op path in process (procgroup.backend._recorder.wrap): which ops
name a caller (those that wait, fail, are issued or still run when read) and which frame,
the entry's fields and states, the ring's bound.

A channel here is only what ``wrap`` reads of one (its GroupInfo); the ops are plain
functions, so each case checks exactly what the recorder wrote.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any
from collections.abc import Callable

import numpy as np
import pytest

from procgroup.backend import _recorder, poll

pytestmark = pytest.mark.unit


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _recorder.Recorder:
    """A fresh ring of 8 entries in place of the process's."""
    monkeypatch.setenv(_recorder.ENV_RING, "8")
    rec = _recorder.Recorder()
    rec.configure()
    monkeypatch.setattr(_recorder, "RECORDER", rec)
    # only procgroup's own directory counts as its own: earlier tests in the process may
    # have registered a test module as a backend's package (add_own_package), which would
    # make this file's frames procgroup's and hide the caller
    monkeypatch.setattr(_recorder, "_own_dirs", _recorder._own_dirs[:1])
    monkeypatch.setattr(_recorder, "_OWN_FILES", {})
    return rec


def _channel() -> Any:
    return types.SimpleNamespace(_flight_info=_recorder.GroupInfo("unit", 7, "none", (4, 5), 0))


def _line_of(marker: str) -> int:
    for i, line in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1):
        if marker in line and "_line_of" not in line:
            return i
    raise AssertionError(marker)


def _op_layer(fast: Callable[..., Any], array: Any) -> Any:
    return fast(array, "sum")  # MARK-op-layer


def _public_op(fast: Callable[..., Any], array: Any) -> Any:
    return _op_layer(fast, array)


def test_an_op_that_completes_without_waiting_names_no_caller(recorder: _recorder.Recorder) -> None:
    calls: list[Any] = []
    recorded = _recorder.wrap(_channel(), "all_reduce", lambda a, op: calls.append(op))
    x = np.zeros(3, dtype=np.float64)
    _public_op(recorded, x)
    assert calls == ["sum"]
    first, = _recorder.snapshot()
    assert (first["file"], first["line"], first["function"]) == (None, None, None)
    assert first["caller"] == _recorder.CALLER_OMITTED
    assert (first["op"], first["seq"], first["state"], first["bytes"], first["dtype"]) == (
        "all_reduce", 1, "done", 24, "float64")
    assert (first["group"], first["group_id"], first["group_ranks"], first["kind"]) == ("unit", 7, [4, 5], "collective")
    assert first["start"] > 1e9 and first["end"] is None  # wall-clock seconds; a completed op keeps no end


def _wait_past_the_spin(array: Any, op: Any) -> None:
    """An op whose wait goes past its fast spin: its condition holds only once the entry
    names a caller, which the wait's slow path makes it do (else the wait times out)."""
    entry = _recorder.RECORDER.ring[-1]
    poll(lambda: _named(entry), 5.0, what="unit")


def _named(entry: tuple[Any, ...]) -> bool:
    """Whether the record has named ``entry``'s caller (in its note)."""
    note = _recorder.RECORDER.notes.get((entry[0], entry[1]))
    return note is not None and note[_recorder._N_CODE] is not None


def test_an_op_that_waits_names_its_caller(recorder: _recorder.Recorder) -> None:
    slow = _recorder.wrap(_channel(), "all_reduce", _wait_past_the_spin)
    _public_op(slow, np.zeros(1, dtype=np.float32))
    entry, = _recorder.snapshot()
    # the first frame outside procgroup: this file's _op_layer (a test is not procgroup's)
    assert (entry["file"], entry["function"], entry["line"]) == (__file__, "_op_layer", _line_of("# MARK-op-layer"))
    assert "caller" not in entry and entry["state"] == "done"


def test_a_dump_while_an_op_runs_names_its_caller(recorder: _recorder.Recorder) -> None:
    seen: list[list[dict[str, Any]]] = []

    def reads_the_record(array: Any, op: Any) -> None:
        # a dump taken while the op is in progress (here from its own thread; the
        # responder's thread reads the same stacks)
        seen.append(_recorder.snapshot())
        seen.append([_recorder.dump()])  # the whole dump, JSON-ready

    recorded = _recorder.wrap(_channel(), "all_reduce", reads_the_record)
    recorded(np.zeros(1), "sum")  # MARK-running
    running, = seen[0]
    assert (running["state"], running["function"], running["line"]) == (
        "waiting", "test_a_dump_while_an_op_runs_names_its_caller", _line_of("# MARK-running"))
    assert seen[1][0]["ops"][0]["line"] == _line_of("# MARK-running")


class _Pending:
    """A Work not completed yet (what the record asks of an issued op's Work)."""

    def is_completed(self) -> bool:
        return False


def test_an_issued_op_names_its_caller_at_once(recorder: _recorder.Recorder) -> None:
    start = _recorder.wrap(_channel(), "broadcast", lambda a, root: _Pending(), started=True)
    work = start(np.zeros(2, dtype=np.int64), 1)  # MARK-issued
    entry, = _recorder.snapshot()
    assert (entry["state"], entry["peer"], entry["line"]) == ("issued", 5, _line_of("# MARK-issued"))
    del work


def test_a_failed_op_keeps_its_error_and_end(recorder: _recorder.Recorder) -> None:
    def broken(array: Any, peer: Any, tag: int) -> None:
        raise ValueError("no route\nsecond line")

    send = _recorder.wrap(_channel(), "send", broken)
    with pytest.raises(ValueError, match="no route"):
        send(np.zeros(2, dtype=np.int32), 1, 5)
    entry, = _recorder.snapshot()
    assert (entry["op"], entry["kind"], entry["seq"], entry["peer"], entry["state"]) == ("send", "p2p", 1, 5, "failed")
    assert entry["error"] == "ValueError: no route"
    assert entry["end"] >= entry["start"]
    # a failure names the caller (this test), before the error is explained
    assert (entry["file"], entry["function"]) == (__file__, "test_a_failed_op_keeps_its_error_and_end")


def test_steps_inside_a_collective_are_not_recorded(recorder: _recorder.Recorder) -> None:
    recv = _recorder.wrap(_channel(), "recv", lambda a, peer, tag: 0)
    recv(np.zeros(1), 1, _recorder.MAX_USER_TAG)  # an algorithm's tag
    assert _recorder.snapshot() == []


def test_the_ring_keeps_the_newest_entries_and_counts_all(recorder: _recorder.Recorder) -> None:
    channel = _channel()
    recorder.groups.add(channel._flight_info)
    fast = _recorder.wrap(channel, "all_reduce", lambda a, op: None)
    for _ in range(11):
        fast(np.zeros(1, dtype=np.float32), "sum")
    assert [e["seq"] for e in _recorder.snapshot()] == list(range(4, 12))
    assert recorder.recorded == 11


def test_an_unrecorded_callable_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_recorder.ENV_RING, "0")
    rec = _recorder.Recorder()
    rec.configure()
    monkeypatch.setattr(_recorder, "RECORDER", rec)

    def fn(a: Any, op: Any) -> None:
        return None

    assert _recorder.wrap(_channel(), "all_reduce", fn) is fn


def _op_function(channel: Any, fn: Callable[[Any], Any], array: Any) -> Any:
    """An op function that writes its entry itself, as the op layer's fast paths do
    (_recorder.holds_entry): the local ``entry`` is what the recorder finds on its frame."""
    info = channel._flight_info
    entry = ((info, "all_reduce"), next(info.coll_seq), None, array.nbytes, array.dtype, _recorder._ns())
    _recorder.RECORDER.ring.append(entry)
    try:
        return fn(array)
    except BaseException as exc:
        _recorder.failed(channel, entry, exc)
        raise


_recorder.holds_entry(_op_function)


def test_an_op_function_that_holds_its_entry(recorder: _recorder.Recorder) -> None:
    channel = _channel()
    seen: list[dict[str, Any]] = []
    _op_function(channel, lambda a: seen.extend(_recorder.snapshot()), np.zeros(2, dtype=np.int16))  # MARK-holder
    # while it ran: waiting, its caller named from the stack; afterwards done, nothing
    # written on the op path after the entry
    assert (seen[0]["state"], seen[0]["seq"], seen[0]["bytes"], seen[0]["dtype"], seen[0]["line"]) == (
        "waiting", 1, 4, "int16", _line_of("# MARK-holder"))
    done, = _recorder.snapshot()
    assert (done["state"], done["line"], done["end"]) == ("done", _line_of("# MARK-holder"), None)

    def broken(a: Any) -> None:
        raise ValueError("lost")

    with pytest.raises(ValueError):
        _op_function(channel, broken, np.zeros(1))  # MARK-holder-failed
    failed = _recorder.snapshot()[-1]
    assert (failed["state"], failed["seq"], failed["error"], failed["line"]) == (
        "failed", 2, "ValueError: lost", _line_of("# MARK-holder-failed"))
    assert failed["end"] >= failed["start"]


def test_notes_stay_bounded(recorder: _recorder.Recorder) -> None:
    """Notes (slow, failed, issued ops) of entries that left the ring are dropped."""
    start = _recorder.wrap(_channel(), "broadcast", lambda a, root: _Pending(), started=True)
    works = [start(np.zeros(1), 0) for _ in range(200)]
    assert len(recorder.notes) <= 2 * recorder.size + 64
    assert [e["state"] for e in _recorder.snapshot()] == ["issued"] * recorder.size
    del works[:]  # a Work that is gone completed
    assert {e["state"] for e in _recorder.snapshot()} == {"done"}
