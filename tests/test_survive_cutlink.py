"""Cut links count as deaths (issue 29): on the simulated cluster, a host whose link goes
down (its process alive, unreachable) is found by the survivors' heartbeats, counted
dead, and the survivors shrink and go on; the cut host, a minority of one, never takes
itself for the group: its shrink fails saying so (docs/fault-tolerance.md, "Cut links").

Needs root and network namespaces (procgroup.testing.simcluster); skipped, saying why,
elsewhere. The times are printed, not asserted (bench/chaos.py --cutlink measures them).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from procgroup.testing.simcluster import HostResult, SimCluster, missing

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(missing() is not None, reason=f"simulated cluster: {missing()}"),
]

JOB = Path(__file__).resolve().parent.parent / "bench" / "cutlink_job.py"
HEARTBEAT_S = 3.0


def run_cut(hosts: int, victim: int, tmp: Path) -> tuple[float, list[HostResult]]:
    """Run the job on ``hosts`` hosts, cut ``victim``'s link once every rank runs;
    the wall-clock time of the cut and every host's result."""
    done: list[list[HostResult]] = []
    env = {"CUTLINK_DIR": str(tmp), "PROCGROUP_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S)}
    with SimCluster(hosts, rate=None, delay="0.1ms") as cluster:
        runner = threading.Thread(target=lambda: done.append(
            cluster.run([sys.executable, str(JOB)], env=env, timeout=200, grace=60)))
        runner.start()
        deadline = time.monotonic() + 150
        while not all((tmp / f"ready-{r}").exists() for r in range(hosts)):
            assert runner.is_alive() and time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        time.sleep(0.3)
        cut_at = time.time()
        cluster.cut_link(victim)
        runner.join(250)
        assert done, "the job never ended"
    return cut_at, done[0]


def _results(results: list[HostResult]) -> dict[int, dict[str, Any]]:
    report = "".join(f"--- {r.host.hostname}: exit {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}\n"
                     for r in results)
    out = {}
    for r in results:
        assert r.returncode == 0, report
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
        assert line is not None, report
        out[r.host.index] = json.loads(line[len("RESULT "):])
    return out


def test_a_cut_host_is_counted_dead_and_the_majority_goes_on(tmp_path: Path) -> None:
    hosts, victim = 4, 2
    cut_at, results = run_cut(hosts, victim, tmp_path)
    out = _results(results)
    for rank, res in out.items():
        if rank == victim:
            assert res["role"] == "minority", res
            assert "not a majority" in res["shrink_error"], res
            assert res["failed_ranks"] and victim not in res["failed_ranks"], res  # it blamed the others
            continue
        assert res["role"] == "survivor" and res["new_size"] == hosts - 1 and res["exact"], res
        assert victim in res["failed_ranks"], res
        assert "heartbeat" in res["error"] or f"rank {victim}" in res["error"], res
    detect = [out[r]["detected_at"] - cut_at for r in out if r != victim]
    print(f"cut link, {hosts} hosts, heartbeat {HEARTBEAT_S:g} s: detection {min(detect):.3f}-"
          f"{max(detect):.3f} s after the cut; shrink {max(out[r]['shrink_s'] for r in out if r != victim):.3f} s")


def test_the_cut_host_may_be_rank_0(tmp_path: Path) -> None:
    """Rank 0 (the Store's host, the agreement's first coordinator) is the one cut off."""
    hosts = 3
    _, results = run_cut(hosts, 0, tmp_path)
    out = _results(results)
    assert out[0]["role"] == "minority", out[0]
    assert all(out[r]["role"] == "survivor" and out[r]["new_size"] == 2 and out[r]["exact"] for r in (1, 2)), out
