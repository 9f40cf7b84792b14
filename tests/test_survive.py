"""Survivors go on (issue 17): revoke, shrink, agree, failed_ranks on real processes.

Each job starts real ranks (tcp over sockets, or tcp with the shared-memory arena; gloo),
kills one or more of them (os._exit, SIGKILL, SIGSTOP), and checks that every survivor
sees the death, shrinks, and gets exact results in the new numbering. Promptness is
structural, never timed: the op timeout (600 s) is far beyond the job's, so a survivor
that waited for it instead of hearing of the death fails the job.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import procgroup as pg
import pytest
from _installed import require_gloo, require_mpi
from procgroup.testing import spawn

SHM = {"sockets": {"PROCGROUP_TCP_SHM": "0"}, "shm": {"PROCGROUP_TCP_SHM": "1"}}


def _die(how: str) -> None:
    # what this rank sent last must have left the host: a process that dies with unread
    # input makes its kernel reset the connections and drop what it had not sent yet
    time.sleep(0.3)
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)


def _exact_ops(old_rank: int, survivors: list[int]) -> dict[str, object]:
    """all_reduce, broadcast, send/recv in the new numbering; every value is known."""
    n = pg.get_world_size()
    me = pg.get_rank()
    assert n == len(survivors) and me == survivors.index(old_rank)
    x = np.full(1000, float(old_rank + 1))
    pg.all_reduce(x)
    assert np.all(x == sum(r + 1 for r in survivors)), x[:3]
    big = np.full(300_000, float(me))  # the large-array paths (pipelined ring / arena pieces)
    pg.all_reduce(big)
    assert np.all(big == sum(range(n)))
    b = np.full(7, float(me * 10))
    pg.broadcast(b, src=n - 1)
    assert np.all(b == (n - 1) * 10.0)
    nxt, prv = (me + 1) % n, (me - 1) % n
    out = np.full(5, float(me), dtype=np.float64)
    got = np.empty(5)
    work = pg.isend(out, nxt)
    pg.recv(got, prv)
    work.wait()
    assert np.all(got == prv)
    pg.barrier()
    return {"rank": me, "size": n}


def one_dies(rank: int, size: int, victim: int, how: str) -> object:
    x = np.ones(8)
    pg.all_reduce(x)
    assert x[0] == size
    if rank == victim:
        _die(how)
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)) as info:
        y = np.ones(8)
        pg.all_reduce(y)
        pg.all_reduce(y)  # a survivor that finished the first before the death fails here
    err = info.value
    assert victim in getattr(err, "ranks", ()), (err, getattr(err, "ranks", None))
    assert pg.failed_ranks() == (victim,)
    new = pg.shrink(timeout=30)
    survivors = [r for r in range(size) if r != victim]
    assert new.ranks == tuple(range(size - 1))
    result = _exact_ops(rank, survivors)
    assert pg.failed_ranks() == ()
    return result


@pytest.mark.parametrize("path", ["sockets", "shm"])
@pytest.mark.parametrize(("size", "victim", "how"), [(4, 2, "exit"), (5, 0, "kill")])
def test_one_rank_dies_survivors_shrink(path: str, size: int, victim: int, how: str) -> None:
    results = spawn(one_dies, size, "tcp", args=(victim, how), env=SHM[path], expect_dead=[victim],
                    timeout=600, job_timeout=150)
    alive = [r for i, r in enumerate(results) if i != victim]
    assert sorted(r["rank"] for r in alive) == list(range(size - 1))
    assert all(r["size"] == size - 1 for r in alive)


def two_die_in_turn(rank: int, size: int) -> object:
    """Rank 0 dies, the survivors shrink; then a middle rank dies, they shrink again."""
    if rank == 0:
        _die("kill")
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.barrier()
    pg.shrink(timeout=30)
    survivors = list(range(1, size))
    _exact_ops(rank, survivors)
    victim = 3  # old rank 3: new rank 2
    if rank == victim:
        _die("exit")
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.barrier()
    assert pg.failed_ranks() == (survivors.index(victim),)
    pg.shrink(timeout=30)
    survivors.remove(victim)
    return _exact_ops(rank, survivors)


def test_two_ranks_die_in_turn() -> None:
    results = spawn(two_die_in_turn, 6, "tcp", expect_dead=[0, 3], timeout=600, job_timeout=150)
    assert sorted(r["rank"] for r in results if r is not None) == [0, 1, 2, 3]


def old_handles_fail(rank: int, size: int) -> object:
    left = pg.new_group([0, 1])
    right = pg.new_group([2, 3])
    if rank == 1:
        _die("exit")
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.barrier()
    pg.shrink(timeout=30)
    for handle in (left, right):
        if rank in handle.ranks:
            with pytest.raises(pg.GroupRevokedError) as info:
                pg.barrier(group=handle)
            held = "held rank(s) [1]" in str(info.value)
            assert held == (handle is left) and "new_group" in str(info.value), str(info.value)
    # a new group in the new numbering works
    g = pg.new_group([0, 2])
    if pg.get_rank() in (0, 2):
        x = np.array([float(pg.get_rank())])
        pg.all_reduce(x, group=g)
        assert x[0] == 2.0
    return pg.get_rank()


def test_old_group_handles_raise_naming_the_dead() -> None:
    assert spawn(old_handles_fail, 4, "tcp", expect_dead=[1], timeout=600, job_timeout=150)[0] == 0


def subgroup_shrinks(rank: int, size: int) -> object:
    """A sub-group loses a member and shrinks on its own; then the world shrinks."""
    g = pg.new_group([1, 2, 3])
    if rank == 3:
        _die("exit")
    if rank in (1, 2):
        with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
            pg.barrier(group=g)
        assert pg.failed_ranks(g) == (2,)  # the group's numbering: world rank 3 is its rank 2
        new = pg.shrink(group=g, timeout=30)
        assert new.ranks == (1, 2) and pg.get_rank(new) == rank - 1
        x = np.array([float(rank)])
        pg.all_reduce(x, group=new)
        assert x[0] == 3.0
        with pytest.raises(pg.GroupRevokedError, match="shrink"):
            pg.barrier(group=g)
        # the calls the core takes fast once a dtype passed (x's did, above) check it too
        with pytest.raises(pg.GroupRevokedError, match="shrink"):
            pg.all_reduce(x, group=g)
        with pytest.raises(pg.GroupRevokedError, match="shrink"):
            pg.send(x, 3 - rank, group=g)
    pg.shrink(timeout=30)
    return _exact_ops(rank, [0, 1, 2])


def test_a_sub_group_shrinks_on_its_own() -> None:
    results = spawn(subgroup_shrinks, 4, "tcp", expect_dead=[3], timeout=600, job_timeout=150)
    assert [r["size"] for r in results[:3]] == [3, 3, 3]


def revoke_reaches_everyone(rank: int, size: int) -> object:
    """Rank 0 revokes while the others wait in a collective on a live peer (rank 0)."""
    if rank == 0:
        time.sleep(0.5)
        pg.revoke()
    with pytest.raises(pg.GroupRevokedError):
        pg.barrier()
    assert pg.agree(True, timeout=20) is True
    pg.shrink(timeout=30)  # nobody died: the same members, a fresh channel
    return _exact_ops(rank, list(range(size)))


def test_revoke_fails_pending_ops_everywhere() -> None:
    # the op timeout (600 s) is far beyond the job's (120 s): a rank that waited for it
    # instead of hearing the revoke fails the job (no timed assertion)
    results = spawn(revoke_reaches_everyone, 4, "tcp", timeout=600, job_timeout=120)
    assert [r["size"] for r in results] == [4, 4, 4, 4]


def chain_learns(rank: int, size: int) -> object:
    """Rank 0 waits on rank 1 (alive), which waits on rank 2, which dies: rank 0 hears of
    it at once through rank 1's and its own connections, not at the op timeout."""
    buf = np.zeros(4)
    if rank == 2:
        _die("exit")
    with pytest.raises(pg.PeerError) as info:
        if rank == 0:
            pg.recv(buf, src=1)
        elif rank == 1:
            pg.recv(buf, src=2)
        else:
            pg.recv(buf, src=0)
    assert 2 in info.value.ranks, info.value.ranks
    return pg.failed_ranks()


def test_a_rank_waiting_on_a_live_peer_learns_of_a_death() -> None:
    results = spawn(chain_learns, 4, "tcp", expect_dead=[2], timeout=600, job_timeout=120)
    assert [r for i, r in enumerate(results) if i != 2] == [(2,), (2,), (2,)]


def agree_with_death(rank: int, size: int) -> object:
    """agree is an AND; a rank that dies during the call (the coordinator, rank 0, in the
    second round) leaves every survivor with the same answer."""
    assert pg.agree(True, timeout=20) is True
    assert pg.agree(rank != 2, timeout=20) is False
    if rank == 0:
        _die("kill")  # the coordinator dies in the call
    value = pg.agree(rank != 3, timeout=20)
    assert value is False  # rank 3's False is never lost: it is alive
    known = pg.failed_ranks()
    value2 = pg.agree(True, timeout=20)
    return value, value2, known


def test_agree_survives_the_coordinator_dying() -> None:
    results = spawn(agree_with_death, 5, "tcp", expect_dead=[0], timeout=600, job_timeout=150)
    assert {tuple(r[:2]) for r in results[1:]} == {(False, True)}
    assert all(r[2] == (0,) for r in results[1:]), results


def death_during_shrink(rank: int, size: int) -> object:
    """Rank 1 dies, and rank 4 dies just as the survivors shrink."""
    if rank == 1:
        _die("exit")
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.barrier()
    if rank == 4:
        _die("kill")  # after the first death is known: in the middle of the others' shrink
    pg.shrink(timeout=40)
    return _exact_ops(rank, [0, 2, 3, 5])


def test_a_death_during_shrink() -> None:
    results = spawn(death_during_shrink, 6, "tcp", expect_dead=[1, 4], timeout=600, job_timeout=150)
    assert sorted(r["rank"] for r in results if r is not None) == [0, 1, 2, 3]


def death_while_building(rank: int, size: int) -> object:
    """Rank 3 takes part in the agreement, then dies while the new channel is being built:
    the survivors abandon that attempt and agree again without it."""
    if rank == 1:
        _die("exit")
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.barrier()
    channel = pg.group_channel()
    if rank == 3:
        def die_in_build(ctx: object) -> object:
            os.kill(os.getpid(), signal.SIGKILL)  # no grace: mid-shrink
            raise AssertionError("unreachable")

        channel.do_shrink = die_in_build  # type: ignore[method-assign]  # the failure under test
    pg.shrink(timeout=60)
    return _exact_ops(rank, [0, 2, 4])


def test_a_death_while_the_new_channel_is_built() -> None:
    results = spawn(death_while_building, 5, "tcp", expect_dead=[1, 3], timeout=600, job_timeout=150)
    assert [r["rank"] for r in results if r is not None] == [0, 1, 2]


def frozen_rank(rank: int, size: int) -> object:
    """A SIGSTOPped rank counts as dead after the heartbeat deadline; a slow one never."""
    pids = [None] * size
    pg.all_gather_object(pids, os.getpid())
    if rank == 1:
        time.sleep(5.0)  # slow, not dead: twice the deadline (2.5 s), heartbeats go on
    pg.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.barrier()
    pg.shrink(timeout=30)
    if pg.get_rank() == 0:
        os.kill(pids[2], signal.SIGKILL)
    return _exact_ops(rank, [0, 1, 3])


def test_frozen_rank_counts_as_dead_slow_rank_does_not() -> None:
    env = {"PROCGROUP_HEARTBEAT_TIMEOUT": "2.5"}  # the op timeout (600 s) would fail the job first
    results = spawn(frozen_rank, 4, "tcp", env=env, expect_dead=[2], timeout=600, job_timeout=120)
    assert [i for i, d in enumerate(results) if d is not None] == [0, 1, 3]


def gloo_rank_dies(rank: int, size: int) -> object:
    x = np.ones(4)
    pg.all_reduce(x)
    if rank == 1:
        _die("kill")
    with pytest.raises((pg.PeerError, pg.GroupRevokedError)):
        pg.all_reduce(x)
        pg.all_reduce(x)
    assert 1 in pg.failed_ranks()
    pg.shrink(timeout=60)
    assert pg.get_backend() == "gloo"
    return _exact_ops(rank, [0, 2, 3])


def test_gloo_survivors_shrink_to_a_new_gloo_context() -> None:
    require_gloo()
    results = spawn(gloo_rank_dies, 4, "gloo", expect_dead=[1], timeout=600, job_timeout=150)
    assert [r["rank"] for r in results if r is not None] == [0, 1, 2]


def mpi_refuses(rank: int, size: int) -> object:
    with pytest.raises(pg.errors.UnsupportedOperationError, match="ULFM"):
        pg.shrink()
    with pytest.raises(pg.errors.UnsupportedOperationError, match="ULFM"):
        pg.agree(True)
    return True


def test_mpi_says_it_cannot_shrink() -> None:
    require_mpi()
    assert spawn(mpi_refuses, 2, "mpi", launcher="mpiexec", init_method=None, timeout=60) == [True, True]


class _SendRecvOnly(pg.DataChannel):
    """A third-party plugin with point-to-point only (no control plane)."""

    def __init__(self, ctx: pg.ChannelContext) -> None:
        super().__init__(ctx)

    def do_send(self, array: object, dst: int, tag: int = 0) -> None:
        raise AssertionError("not used")

    def do_recv(self, array: object, src: int | None = None, tag: int = 0) -> int:
        raise AssertionError("not used")


def test_a_plugin_without_the_hooks_gets_a_clear_error() -> None:
    from procgroup.backend import ChannelContext
    from procgroup.rendezvous import HashStore

    channel = _SendRecvOnly(ChannelContext(rank=0, size=1, store=HashStore(), timeout=5.0))
    assert not channel.survives
    for call in (channel.revoke, lambda: channel.agree(True, 1.0), lambda: channel.do_shrink(channel.ctx)):
        with pytest.raises(pg.errors.UnsupportedOperationError, match="do_control_send"):
            call()
    assert channel.failed_ranks() == ()
    channel.close()
