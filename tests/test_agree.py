"""Any group, any time (issue 29): revoke, agree, shrink and failed_ranks on the world and
on groups made with new_group, as the job's first agreement or a later one, with nobody
dead and after a death, on disjoint and nested groups at once; on tcp and gloo.

One spawned job per backend runs the whole matrix: a phase with nobody dead, then rank 3
exits and the survivors run it again. One job per transport (tcp, gloo on each engine)
checks that a revoke wakes the group's pending receives and collectives, and nothing of
another group. Every call has a timeout far below the job's, so a
hang fails the job with the ranks that never reported, and a call past its bound is a
CommTimeoutError naming who did not answer.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import procgroup as pg
import pytest
from _installed import gloo_engine_env, require_gloo
from procgroup.testing import spawn

T = 60.0  # every agree/shrink's bound: far below the job's, far above a loaded machine's delays


def _sum_check(g: pg.Group, world_ranks: list[int]) -> None:
    """An all_reduce on ``g`` (members ``world_ranks``, in order) with a known result."""
    x = np.full(16, float(pg.get_rank() + 1))
    pg.all_reduce(x, group=g)
    assert np.all(x == sum(r + 1 for r in world_ranks)), (x[:2], world_ranks)


def _at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` on threads of their own, at the same time; their results (or errors)."""
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller, which re-raises
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * T)
    for value in out:
        if isinstance(value, BaseException):
            raise value
    return out


def _wait_revoked(g: pg.Group) -> None:
    deadline = time.monotonic() + T
    while not isinstance(pg.group_channel(g).failure, pg.GroupRevokedError):
        assert time.monotonic() < deadline, "the revoke never arrived"
        time.sleep(0.01)


def nobody_dead(rank: int) -> dict[str, Any]:
    """Phase 1, four ranks, nobody dead. Returns what each check saw."""
    seen: dict[str, Any] = {}
    # the job's first agreement is a sub-group's, and rank 1 creates the group late: the
    # others' first messages reach it before its new_group returned (they must be kept)
    if rank == 1:
        time.sleep(0.5)
    g123 = pg.new_group([1, 2, 3])
    if rank in (1, 2, 3):
        seen["first_sub"] = pg.agree(True, group=g123, timeout=T)
        seen["sub_and"] = pg.agree(rank != 2, group=g123, timeout=T)
        seen["sub_failed"] = pg.failed_ranks(g123)
    # two disjoint groups agree at the same time, with the coordinator created last
    if rank == 0:
        time.sleep(0.3)
    g01, g23 = pg.new_group([0, 1]), pg.new_group([2, 3])
    mine = g01 if rank < 2 else g23
    seen["disjoint"] = pg.agree(rank % 2 == 0 or rank == 1, group=mine, timeout=T)
    # nested: the world and a sub-group holding this rank agree at once, from two threads
    g013 = pg.new_group([0, 1, 3])
    if rank in (0, 1, 3):
        seen["nested"] = _at_once(lambda: pg.agree(True, timeout=T),
                                  lambda: pg.agree(rank != 3, group=g013, timeout=T))
    else:
        seen["nested"] = [pg.agree(True, timeout=T), None]
    # a later agreement of the world
    seen["world_later"] = pg.agree(True, timeout=T)
    # shrink of a sub-group with nobody dead: the same members, in a working group
    if rank in (1, 2, 3):
        g123 = pg.shrink(g123, timeout=T)
        seen["shrunk_sub"] = g123.ranks
        _sum_check(g123, [1, 2, 3])
    # revoke of a sub-group: the other member's pending receive and its next op fail,
    # shrink makes it usable (pending ops of every kind: test_revoke_wakes_pending_ops)
    if rank in (2, 3):
        if rank == 2:
            time.sleep(0.3)
            pg.revoke(g23)
        else:
            with pytest.raises(pg.GroupRevokedError):
                pg.recv(np.zeros(4), src=2, group=g23)
        _wait_revoked(g23)
        with pytest.raises(pg.GroupRevokedError):
            buf = np.zeros(4)
            pg.recv(buf, src=2 if rank == 3 else 3, group=g23)
        g23 = pg.shrink(g23, timeout=T)
        seen["revoked_shrunk"] = g23.ranks
        _sum_check(g23, [2, 3])
    # the world still works; the next phase starts together
    _sum_check(pg.group.WORLD, [0, 1, 2, 3])
    return {"seen": seen, "groups": (g01, g013, g123)}


def after_a_death(rank: int, groups: tuple[pg.Group, ...]) -> dict[str, Any]:
    """Phase 2: rank 3 exits; the survivors (0, 1, 2) run the matrix again."""
    g01, g013, g123 = groups
    g02 = pg.new_group([0, 2])  # its first agreement comes after the death
    if rank == 3:
        time.sleep(1.0)  # what it sent (phase 1's last all_reduce) must be read before it exits
        os._exit(3)
    seen: dict[str, Any] = {}
    # a group without the dead rank: agreement with nobody dead there, first and later
    if rank in (0, 2):
        seen["first_without_dead"] = [pg.agree(True, group=g02, timeout=T), pg.agree(True, group=g02, timeout=T)]
        seen["failed_without_dead"] = pg.failed_ranks(g02)
    if rank in (0, 1):
        seen["later_without_dead"] = pg.agree(True, group=g01, timeout=T)
    # groups holding the dead rank: a later agreement (g013), and the shrunk g123's, whose
    # channel is new; both shrink to their survivors at once with the world's agreement
    calls: list[Callable[[], Any]] = [lambda: pg.agree(True, timeout=T)]
    if rank in (0, 1):
        calls.append(lambda: (pg.agree(True, group=g013, timeout=T), pg.failed_ranks(g013),
                              pg.shrink(g013, timeout=T)))
    if rank in (1, 2):
        calls.append(lambda: (pg.agree(True, group=g123, timeout=T), pg.failed_ranks(g123),
                              pg.shrink(g123, timeout=T)))
    results = _at_once(*calls)
    seen["world_after"] = results[0]
    for value in results[1:]:
        agreed, failed, new = value
        assert agreed is True and len(failed) == 1, value
        _sum_check(new, [r for r in (0, 1, 2) if r in new.ranks])
        seen.setdefault("shrunk", []).append(new.ranks)
    # the world: revoke, agree, shrink, go on
    pg.revoke()
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):  # the death, or the revoke
        pg.barrier()
    seen["world_failed"] = pg.failed_ranks()
    pg.shrink(timeout=T)
    _sum_check(pg.group.WORLD, [0, 1, 2])
    seen["world_size"] = pg.get_world_size()
    return seen


def matrix(rank: int, size: int) -> dict[str, Any]:
    first = nobody_dead(rank)
    return {"before": first["seen"], "after": after_a_death(rank, first["groups"])}


def _check_matrix(results: list[Any]) -> None:
    assert results[3] is None  # the victim
    for rank in (0, 1, 2, 3):
        b = results[rank]["before"] if rank != 3 else None
        if b is None:
            continue
        if rank in (1, 2):
            assert b["first_sub"] is True and b["sub_and"] is False and b["sub_failed"] == ()
            assert b["shrunk_sub"] == (1, 2, 3)
        assert b["world_later"] is True
        if rank == 2:
            assert b["revoked_shrunk"] == (2, 3)
    assert [results[r]["before"]["disjoint"] for r in (0, 1)] == [True, True]
    assert results[2]["before"]["disjoint"] is False  # rank 3 said False in {2, 3}
    assert [results[r]["before"]["nested"][1] for r in (0, 1)] == [False, False]  # rank 3 said False
    for rank in (0, 1, 2):
        a = results[rank]["after"]
        assert a["world_after"] is True and a["world_failed"] == (3,) and a["world_size"] == 3
        if rank in (0, 2):
            assert a["first_without_dead"] == [True, True] and a["failed_without_dead"] == ()
        if rank in (0, 1):
            assert a["later_without_dead"] is True
    assert sorted(results[0]["after"]["shrunk"]) == [(0, 1)]
    assert sorted(results[1]["after"]["shrunk"]) == [(0, 1), (1, 2)]
    assert sorted(results[2]["after"]["shrunk"]) == [(1, 2)]


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_any_group_any_time(backend: str) -> None:
    if backend == "gloo":
        require_gloo()
    results = spawn(matrix, 4, backend, expect_dead=[3], timeout=600, job_timeout=240)
    _check_matrix(results)


def _revoked(call: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """``call`` fails with GroupRevokedError (it was pending when the revoke came)."""
    with pytest.raises(pg.GroupRevokedError):
        call(*args, **kwargs)
    return "revoked"


def revoke_wakes_pending(rank: int, size: int) -> dict[str, Any]:
    """A revoke wakes the group's pending ops on every member, and nothing of another
    group: a sub-group's named and any-source receives and its collective, then the
    world's. The op timeout (600 s) is far beyond the job's, so an op that waited for it
    fails the job; the revoker sleeps first, so the others are waiting when it comes."""
    g01, g23, g123 = pg.new_group([0, 1]), pg.new_group([2, 3]), pg.new_group([1, 2, 3])
    if rank in (2, 3):
        _sum_check(g23, [2, 3])  # every context connected: the waits below are gloo's own
    if rank in (1, 2, 3):
        _sum_check(g123, [1, 2, 3])
    seen: dict[str, Any] = {}
    # a sub-group's pending receive from a named source (rank 2 revokes)
    if rank == 3:
        seen["sub_named"] = _revoked(pg.recv, np.zeros(4), src=2, group=g23)
    elif rank == 2:
        time.sleep(0.5)
        pg.revoke(g23)
    # another sub-group's: an any-source receive (rank 1) and a collective (rank 2) fail;
    # rank 1's receive on g01, pending as well, gets its message: rank 0 sends it once
    # rank 3 (the revoker) says it revoked
    if rank == 1:
        seen["sub_any"], seen["other_group"] = _at_once(
            lambda: _revoked(pg.recv, np.zeros(4), group=g123, tag=1),
            lambda: (pg.recv(got := np.zeros(4), src=0, group=g01, tag=2), float(got[0])))
    elif rank == 2:
        seen["sub_collective"] = _revoked(pg.all_reduce, np.ones(4), group=g123)
    elif rank == 3:
        time.sleep(0.5)
        pg.revoke(g123)
        pg.send(np.ones(1), dst=0, tag=3)
    else:
        pg.recv(np.zeros(1), src=3, tag=3)
        pg.send(np.full(4, 7.0), dst=1, group=g01, tag=2)
    # the world's: an any-source receive (ranks 0, 1) and a collective (rank 2)
    if rank in (0, 1):
        seen["world_any"] = _revoked(pg.recv, np.zeros(4), tag=4)
    elif rank == 2:
        seen["world_collective"] = _revoked(pg.all_reduce, np.ones(4))
    else:
        time.sleep(0.5)
        pg.revoke()
    if rank in (0, 1):  # a group split off the revoked world goes on
        _sum_check(g01, [0, 1])
    return seen


@pytest.mark.parametrize("engine", ["tcp", "pygloo", "torch"])
def test_revoke_wakes_pending_ops(engine: str) -> None:
    env = None if engine == "tcp" else gloo_engine_env(engine)
    results = spawn(revoke_wakes_pending, 4, "tcp" if engine == "tcp" else "gloo", env=env,
                    timeout=600, job_timeout=120)
    assert results[0] == {"world_any": "revoked"}
    assert results[1] == {"sub_any": "revoked", "other_group": (0, 7.0), "world_any": "revoked"}
    assert results[2] == {"sub_collective": "revoked", "world_collective": "revoked"}
    assert results[3] == {"sub_named": "revoked"}


def three_ranks_first(rank: int, size: int) -> object:
    """The issue's case: 3 ranks, a group's agreement is the job's first, the coordinator
    creates the group last; then shrink of that group with nobody dead."""
    if rank == 0:
        time.sleep(0.5)
    g = pg.new_group([0, 1])
    if rank == 2:
        return pg.agree(True, timeout=T)
    first = pg.agree(True, group=g, timeout=T)
    new = pg.shrink(g, timeout=T)
    _sum_check(new, [0, 1])
    return first and pg.agree(True, timeout=T)


def test_three_ranks_first_agreement_on_a_group() -> None:
    assert spawn(three_ranks_first, 3, "tcp", timeout=600, job_timeout=120) == [True, True, True]


def silent_member(rank: int, size: int) -> object:
    """A member that never joins the agreement: bounded by the group's timeout (new_group's
    timeout=), a clear error naming it, on the coordinator and on the member that waits."""
    g = pg.new_group([0, 1, 2], timeout=2)
    if rank == 2:
        pg.barrier(group=pg.new_group([0, 1, 2]))
        return "stayed out"
    with pytest.raises(pg.CommTimeoutError) as info:
        pg.agree(True, group=g)  # the group's own timeout: 2 s
    got = str(info.value)
    pg.barrier(group=pg.new_group([0, 1, 2]))
    return got


def test_an_agreement_missing_a_member_times_out_clearly() -> None:
    results = spawn(silent_member, 3, "tcp", timeout=600, job_timeout=120)
    assert "ranks [2] did not answer within 2s" in results[0], results[0]
    assert "no decision from the coordinator (rank 0) within 2s" in results[1], results[1]
