"""The tcp backend against the conformance suite, with 1 to 4 real ranks, on both paths.

On one host the tcp backend runs collectives through shared memory; with
PROCGROUP_TCP_SHM=0 (what ranks on different hosts get) everything goes over the sockets.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from procgroup.testing import ConformanceSuite, spawn
from procgroup.testing._huge import over_2gib, skip_unless_memory


class TestTcpConformance(ConformanceSuite):
    backend = "tcp"
    world_sizes = (1, 2, 3, 4)


class TestTcpSocketsOnly(ConformanceSuite):
    backend = "tcp"
    world_sizes = (2, 3)
    env = {"PROCGROUP_TCP_SHM": "0"}


def _die_while_sending(rank: int, size: int) -> dict[str, Any]:
    """Rank 1 dies part-way through a 768 MiB frame; rank 0's recv must fail, not hang."""
    import procgroup as pg
    from procgroup.errors import ProcGroupError

    big = np.zeros(768 << 20, dtype=np.uint8)
    if rank == 1:
        threading.Timer(0.02, os._exit, args=(3,)).start()
        pg.send(big, 0)
        time.sleep(10)
        return {}
    start = time.monotonic()
    try:
        pg.recv(big, 1)
        return {"error": None, "seconds": time.monotonic() - start}
    except ProcGroupError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


def test_peer_dying_mid_message_fails_the_receive() -> None:
    result = spawn(_die_while_sending, 2, timeout=8.0, expect_dead=[1], job_timeout=60.0,
                   env={"PROCGROUP_TCP_SHM": "0"})[0]
    assert result["error"] == "PeerError", result
    assert "rank 1" in result["message"] and result["seconds"] < 8.0, result


def _mismatched_sizes(rank: int, size: int) -> list[str]:
    import procgroup as pg
    from procgroup.errors import MismatchError

    seen = []
    for count in (10 + rank, 70_000 + rank):  # the small and the large shared-memory paths
        try:
            pg.all_reduce(np.ones(count, dtype=np.float32))
        except MismatchError as exc:
            seen.append(str(exc))
    arr = np.ones(4)
    pg.all_reduce(arr)  # the ranks are still in step afterwards
    seen.append(str(arr[0]))
    return seen


def test_shared_memory_refuses_arrays_that_differ_across_ranks() -> None:
    for rank, seen in enumerate(spawn(_mismatched_sizes, 2)):
        assert len(seen) == 3 and all("disagree" in m for m in seen[:2]), seen
        assert f"rank {1 - rank} called" in seen[0], seen
        assert seen[2] == "2.0"


@pytest.mark.skipif(os.environ.get("PROCGROUP_SKIP_HUGE") == "1", reason="PROCGROUP_SKIP_HUGE=1")
@pytest.mark.parametrize("shm", ["1", "0"])
def test_messages_over_2gib(shm: str) -> None:
    """64-bit frame lengths on the sockets, and pieces on the shared-memory path."""
    nbytes = 2**31 + 4099
    skip_unless_memory(5 * nbytes)
    results = spawn(over_2gib, 2, args=(nbytes,), timeout=300, job_timeout=500, env={"PROCGROUP_TCP_SHM": shm})
    assert results == [{"bcast": True, "p2p": True, "max": True}] * 2
