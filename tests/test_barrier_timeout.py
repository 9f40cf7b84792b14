"""barrier(timeout=...) on real ranks: an expired barrier gives the group up (it stays in
flight, so a later collective would pair with it), and timeout= with async_op=True is
refused."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)


def _expire(rank: int, size: int) -> dict[str, Any]:
    import procgroup as pg

    out: dict[str, Any] = {}
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


def test_an_expired_barrier_revokes_the_group() -> None:
    results = spawn(_expire, 2, "tcp", timeout=20, job_timeout=120)
    for out in results:
        assert "timeout=" in out["async"] and "work.wait(timeout=...)" in out["async"], out
        assert out["after"] == "GroupRevokedError", out
    text = results[0]["timeout"]
    assert "not every member of [0, 1] arrived within 0.3s" in text and "the group is revoked" in text, text
