"""The ULFM patterns of examples/ulfm_*.py (issue 29), each run as a real job.

Each example's ``run(rank, size)`` runs in spawned tcp ranks; a victim exits along the
way, and the survivors' results are checked here against what they must be.
"""

from __future__ import annotations

import sys
from pathlib import Path

from procgroup.testing import spawn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import ulfm_bag_of_tasks  # examples/ is on the path (above)
import ulfm_revoke_ring
import ulfm_shrink_until_one


def test_revoke_ring_reports_over_a_group_without_the_victim() -> None:
    results = spawn(ulfm_revoke_ring.run, 4, "tcp", expect_dead=[2], timeout=600, job_timeout=150)
    assert results[2] is None
    alive = [results[r] for r in (0, 1, 3)]
    total = sum(r["passes"] for r in alive)
    assert all(r["all_passes"] == total for r in alive), alive  # the report group's reduce
    assert all(r["stopped"] != "finished" for r in alive), alive  # the ring stopped everywhere
    assert any(r["stopped"] == "saw rank 2 die" for r in alive), alive


def shrink_to_one(rank: int, size: int) -> object:
    return ulfm_shrink_until_one.run(rank, size)


def test_shrink_until_one_is_left() -> None:
    size = 4
    results = spawn(shrink_to_one, size, "tcp", expect_dead=list(range(size)), timeout=600, job_timeout=150)
    last = [r for r in results if r is not None]
    assert len(last) == 1 and last[0]["sizes"] == [4, 3, 2, 1], results
    victims = []  # who died each round, in original ranks
    live = list(range(size))
    for round_no in range(size - 1):
        victims.append(live.pop(ulfm_shrink_until_one.victim_of(round_no, len(live))))
    assert 0 in victims and last[0]["orig"] == live[0]


def test_bag_of_tasks_survives_a_dying_worker() -> None:
    results = spawn(ulfm_bag_of_tasks.run, 4, "tcp", expect_dead=[2], timeout=600, job_timeout=150)
    done = results[0]
    assert done == {t: ulfm_bag_of_tasks.work(t) for t in range(40)}
    assert results[2] is None and all(isinstance(results[r], int) for r in (1, 3))
    assert results[1] + results[3] == 40  # the live workers also computed the task the victim held
