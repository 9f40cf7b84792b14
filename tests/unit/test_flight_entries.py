"""The flight recorder's op path in process (procgroup.backend._recorder.wrap/at_depth):
which frame is named as the caller, the entry's fields and states, the ring's bound.

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

from procgroup.backend import _recorder

pytestmark = pytest.mark.unit


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _recorder.Recorder:
    """A fresh ring of 8 entries in place of the process's."""
    monkeypatch.setenv(_recorder.ENV_RING, "8")
    rec = _recorder.Recorder()
    rec.configure()
    monkeypatch.setattr(_recorder, "RECORDER", rec)
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


def test_the_caller_is_taken_at_the_depth_the_op_layer_gives(recorder: _recorder.Recorder) -> None:
    calls: list[Any] = []
    recorded = _recorder.wrap(_channel(), "all_reduce", lambda a, op: calls.append(op))
    x = np.zeros(3, dtype=np.float64)
    # depth 3: past the op layer and the public op, to the program (this test)
    _public_op(_recorder.at_depth(recorded, 3), x)  # MARK-program
    # depth 1 (wrap's default): the wrapper's own caller, outside procgroup here
    _public_op(recorded, x)
    assert calls == ["sum", "sum"]
    ops = _recorder.snapshot()
    assert [(e["function"], e["line"]) for e in ops] == [
        ("test_the_caller_is_taken_at_the_depth_the_op_layer_gives", _line_of("# MARK-program")),
        ("_op_layer", _line_of("# MARK-op-layer"))]
    first = ops[0]
    assert first["file"] == __file__
    assert (first["op"], first["seq"], first["state"], first["bytes"], first["dtype"]) == (
        "all_reduce", 1, "done", 24, "float64")
    assert (first["group"], first["group_id"], first["group_ranks"], first["kind"]) == ("unit", 7, [4, 5], "collective")
    assert first["start"] > 1e9 and first["end"] is None  # wall-clock seconds; a completed op keeps no end


def test_a_shallower_stack_than_the_depth_names_the_outermost_frame(recorder: _recorder.Recorder) -> None:
    fast = _recorder.at_depth(_recorder.wrap(_channel(), "all_reduce", lambda a, op: None), 10_000)
    fast(np.zeros(1), "sum")
    entry, = _recorder.snapshot()
    outermost = sys._getframe()
    while outermost.f_back is not None:
        outermost = outermost.f_back
    assert (entry["file"], entry["function"]) == (outermost.f_code.co_filename, outermost.f_code.co_name)


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


def test_steps_inside_a_collective_are_not_recorded(recorder: _recorder.Recorder) -> None:
    recv = _recorder.wrap(_channel(), "recv", lambda a, peer, tag: 0)
    recv(np.zeros(1), 1, _recorder.MAX_USER_TAG)  # an algorithm's tag
    assert _recorder.snapshot() == []


def test_the_ring_keeps_the_newest_entries_and_counts_all(recorder: _recorder.Recorder) -> None:
    channel = _channel()
    recorder.groups.add(channel._flight_info)
    fast = _recorder.at_depth(_recorder.wrap(channel, "all_reduce", lambda a, op: None), 1)
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
    assert _recorder.at_depth(fn, 3) is fn
