"""Barriers with a timeout on real ranks, in one job: monitored_barrier leaves no Store
keys behind (in time or after a timeout); an expired barrier(timeout=...) gives the group
up (it stays in flight, so a later collective would pair with it), and timeout= with
async_op=True is refused."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)


def _expire(rank: int, size: int) -> dict[str, Any]:
    import procgroup as pg

    out: dict[str, Any] = {"monitored": _monitored_keys(pg, rank)}
    try:
        pg.barrier(timeout=5, async_op=True)
    except pg.errors.InvalidArgumentError as exc:
        out["async"] = str(exc)
    pg.barrier(timeout=30)  # in time: the group stays usable
    if rank == 0:
        try:
            pg.barrier(timeout=0.3)
        except pg.errors.CommTimeoutError as exc:
            out["timeout"] = str(exc)
    else:
        time.sleep(1.5)  # arrives after rank 0 gave up
    try:
        pg.all_reduce(np.ones(2, np.float32))
        out["after"] = "completed"
    except pg.errors.ProcGroupError as exc:
        out["after"] = type(exc).__name__
    return out


def _monitored_keys(pg: Any, rank: int) -> list[Any]:
    """monitored_barrier 3 times in time, once with rank 1 late, once more in time; after
    each phase (and a barrier, so every rank has left) the keys of those calls that remain."""
    from procgroup import _monitored, _state

    store = _state.world().store
    gid = _state.member(None, "test").group_id
    first = _monitored._calls.get(gid, 0)

    def remaining(calls: range) -> list[str]:
        pg.barrier()
        keys = [f"procgroup/monitored_barrier/{gid}/{c}/{s}" for c in calls for s in ("1", "verdict", "out")]
        return [k for k in keys if store.check([k])]

    seen: list[Any] = []
    for _ in range(3):
        pg.monitored_barrier(timeout=30)
    seen.append(remaining(range(first, first + 3)))
    if rank == 1:
        time.sleep(1.0)
    try:
        pg.monitored_barrier(timeout=0.3)
        seen.append("no timeout")
    except pg.errors.CommTimeoutError as exc:
        seen.append("rank(s) [1] did not" in str(exc))
    pg.monitored_barrier(timeout=30)
    seen.append(remaining(range(first, first + 5)))
    return seen


def test_an_expired_barrier_revokes_the_group() -> None:
    results = spawn(_expire, 2, "tcp", timeout=20, job_timeout=120)
    for out in results:
        assert out["monitored"] == [[], True, []], out
        assert "timeout=" in out["async"] and "work.wait(timeout=...)" in out["async"], out
        assert out["after"] == "GroupRevokedError", out
    text = results[0]["timeout"]
    assert "not every member of [0, 1] arrived within 0.3s" in text and "the group is revoked" in text, text
