"""The tcp backend's socket-path algorithms (PROCGROUP_TCP_SHM=0: what runs between hosts).

Each algorithm (recursive doubling, the pipelined ring, the binomial tree, the segmented
chains) is checked for exact results with every ReduceOp, on 2 to 5 ranks (non-powers of
two included), at sizes just below, at and above each threshold: once with the
thresholds and segments forced tiny (so every size, uneven chunk splits and empty
chunks go through the pipelines), once with the measured defaults. One job per world
size runs all of its checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from procgroup.testing import spawn

SOCKETS = {"PROCGROUP_TCP_SHM": "0"}
#: every size through the pipelines: 8-byte thresholds, 5-element (float64) segments
TINY = {
    **SOCKETS,
    "PROCGROUP_TCP_RING_MIN_BYTES": "8",
    "PROCGROUP_TCP_CHAIN_MIN_BYTES": "8",
    "PROCGROUP_TCP_SEGMENT_BYTES": "40",
}


def _inputs(rank: int, count: int, op: str) -> np.ndarray:
    """Rank ``rank``'s array: small integers, so float sums and products are exact."""
    idx = np.arange(count)
    if op in ("BAND", "BOR", "BXOR"):
        return ((idx * 7 + rank * 13) % 256).astype(np.int64)
    if op == "PRODUCT":
        return (1 + ((idx + rank) % 3 == 0)).astype(np.float64)
    return ((idx * 3 + rank * 5) % 17 - 8).astype(np.float64)


def _expected(size: int, count: int, op: str) -> np.ndarray:
    stack = np.stack([_inputs(r, count, op) for r in range(size)]) if count else np.zeros((size, 0))
    ufunc = {
        "SUM": np.add,
        "AVG": np.add,
        "PRODUCT": np.multiply,
        "MIN": np.minimum,
        "MAX": np.maximum,
        "BAND": np.bitwise_and,
        "BOR": np.bitwise_or,
        "BXOR": np.bitwise_xor,
    }[op]
    out = ufunc.reduce(stack, axis=0)
    return out / size if op == "AVG" else out


def _check_all(rank: int, size: int, counts: list[int]) -> list[str]:
    """all_reduce, reduce (every root) and broadcast (every root) at each count and op."""
    import procgroup as pg

    wrong = []
    for count in counts:
        for op in pg.ReduceOp:
            want = _expected(size, count, op.name)
            arr = _inputs(rank, count, op.name)
            pg.all_reduce(arr, op=op)
            if not np.array_equal(arr, want):
                wrong.append(f"all_reduce {op.name} count {count}: {arr[:6]} != {want[:6]}")
            root = (count + len(op.name)) % size
            arr = _inputs(rank, count, op.name)
            pg.reduce(arr, dst=root, op=op)
            mine = want if rank == root else _inputs(rank, count, op.name)  # non-roots unchanged
            if not np.array_equal(arr, mine):
                wrong.append(f"reduce {op.name} to {root} count {count}: {arr[:6]} != {mine[:6]}")
        for root in range(size):
            arr = _inputs(rank, count, "SUM")
            pg.broadcast(arr, src=root)
            if not np.array_equal(arr, _inputs(root, count, "SUM")):
                wrong.append(f"broadcast from {root} count {count}")
    return wrong


def _around(threshold_bytes: int, itemsize: int = 8) -> list[int]:
    at = threshold_bytes // itemsize
    return [at - 1, at, at + 1]


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_pipelines_at_every_size_and_op(size: int) -> None:
    counts = [1, 2, 3, 4, 5, 6, 7, 11, 64, 1001]  # fewer elements than ranks, uneven chunks
    for rank, wrong in enumerate(spawn(_check_all, size, args=(counts,), env=TINY, timeout=60.0)):
        assert wrong == [], f"rank {rank}: {wrong[:5]}"


def _thresholds(rank: int, size: int) -> dict[str, Any]:
    from procgroup_tcp import _collectives as c

    plan = c.Plan().describe(size)
    counts = sorted(
        {n for key in ("ring_min_bytes", "reduce_chain_min_bytes") for n in _around(plan[key])}
        | ({*_around(plan["broadcast_chain_min_bytes"])} if plan["broadcast_chain_min_bytes"] < 1 << 30 else set())
        | {1, 100, 3 * (1 << 17) + 5}  # 3 MiB + 40 B: the ring's chunks cut in several segments
    )
    return {"plan": plan, "counts": counts, "wrong": _check_all(rank, size, counts)}


@pytest.mark.parametrize("size", [2, 4])
def test_measured_thresholds_both_sides(size: int) -> None:
    results = spawn(_thresholds, size, env=SOCKETS, timeout=60.0, job_timeout=300.0)
    for rank, result in enumerate(results):
        assert result["wrong"] == [], f"rank {rank}: {result['wrong'][:5]}"
        assert result["plan"]["ring_min_bytes"] // 8 in result["counts"], result


def test_pipelines_cut_finer_on_more_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three or more ranks keep several segments in flight per stage; two ranks, or a
    segment set by hand, keep the one size."""
    from procgroup_tcp import _collectives as c

    monkeypatch.delenv("PROCGROUP_TCP_SEGMENT_BYTES", raising=False)
    plan = c.Plan()
    assert plan.ring_segment(4 << 20, 8) == (4 << 20) // 8 // c.RING_SEGMENTS_PER_CHUNK
    assert plan.ring_segment(64 << 20, 8) == c.MULTI_SEGMENT_BYTES
    assert plan.ring_segment(1 << 20, 8) == c.MIN_SEGMENT_BYTES
    assert plan.ring_segment(4 << 20, 2) == c.SEGMENT_BYTES
    assert plan.chain_segment(4 << 20, 8) == c.MULTI_SEGMENT_BYTES
    assert plan.chain_segment(2 << 20, 8) == -(-(2 << 20) // (c.CHAIN_SEGMENTS_PER_HOP * 7))
    assert plan.chain_segment(4 << 20, 2) == c.SEGMENT_BYTES
    monkeypatch.setenv("PROCGROUP_TCP_SEGMENT_BYTES", "65536")
    assert c.Plan().ring_segment(4 << 20, 8) == 65536
    assert c.Plan().chain_segment(4 << 20, 8) == 65536


def _straddle(rank: int, size: int) -> list[str]:
    """Ranks disagree on the size across the ring threshold: MismatchError, then in step."""
    import procgroup as pg
    from procgroup.errors import MismatchError
    from procgroup_tcp import _collectives as c

    at = c.Plan().describe(size)["ring_min_bytes"] // 4
    seen = []
    for count in (at - 1 + rank, at + 2 * rank):  # doubling vs ring; ring vs ring of another size
        try:
            pg.all_reduce(np.ones(count, dtype=np.float32))
            seen.append("no error")
        except MismatchError as exc:
            seen.append(type(exc).__name__)
    arr = np.full(1 << 19, float(rank + 1), dtype=np.float32)
    pg.all_reduce(arr)
    seen.append(str(float(arr[0])) if np.all(arr == arr[0]) else "differs")
    return seen


def test_sizes_that_straddle_a_threshold_are_a_mismatch() -> None:
    for seen in spawn(_straddle, 2, env=SOCKETS, timeout=20.0):
        assert seen == ["MismatchError", "MismatchError", "3.0"], seen


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PROCGROUP_TCP_SEGMENT_BYTES", "1M"),
        ("PROCGROUP_TCP_SEGMENT_BYTES", "0"),
        ("PROCGROUP_TCP_RING_MIN_BYTES", "-1"),
    ],
)
def test_a_bad_setting_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    from procgroup.errors import InvalidArgumentError
    from procgroup_tcp._collectives import Plan

    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgumentError, match=name):
        Plan()


def test_a_bad_socket_buffer_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from procgroup.errors import InvalidArgumentError
    from procgroup_tcp._conn import socket_buffer_bytes

    monkeypatch.setenv("PROCGROUP_TCP_SOCKET_BUFFER", "big")
    with pytest.raises(InvalidArgumentError, match="PROCGROUP_TCP_SOCKET_BUFFER"):
        socket_buffer_bytes()


def _buffers(rank: int, size: int) -> dict[str, Any]:
    import socket

    import procgroup as pg

    peer = pg.group_channel()._peers[1 - rank]
    arr = np.full(3 << 18, float(rank), dtype=np.float32)  # 3 MiB: the pipelined ring
    pg.all_reduce(arr)
    return {"rcvbuf": peer.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), "sum": float(arr[-1])}


def test_the_socket_buffer_setting_reaches_the_sockets() -> None:
    env = {**SOCKETS, "PROCGROUP_TCP_SOCKET_BUFFER": str(256 * 1024)}
    for result in spawn(_buffers, 2, env=env, timeout=20.0):
        assert result["rcvbuf"] >= 256 * 1024 and result["sum"] == 1.0, result  # Linux doubles it
