"""Failure scope as MPI's ULFM defines it (issue 29): a death is reported only by the
operations that involve the dead rank, and any-source receives work again after
``failure_ack``.

One job per transport (tcp over sockets, tcp in shared memory on one host, gloo on each
engine installed here), 4 ranks; rank 3 dies, and the survivors check inside that one
job: the world's collectives and those of a group holding it fail naming it on every
member; a group split off beforehand without it (the reporting group of the ULFM
tutorial's revoke exercise) keeps reducing, also after the world is revoked; object
collectives on it work; point-to-point between live ranks works; sends to and receives
from the dead rank fail; an any-source receive fails until the failure is acknowledged,
then hears the live ranks (a master collecting its workers' results), and
``failure_get_acked`` lists the dead rank. The op timeout (600 s) is far beyond the
job's, so a survivor that waited for it instead of hearing of the death fails the job.

The first failure wins (issue 30): a rank that learns of the death only after a rank
that left because of it (see ``first_failure_wins``) still names the death first.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import procgroup as pg
import pytest
from _installed import gloo_engine_env
from procgroup.testing import spawn

VICTIM = 3
SIZE = 4
REPORT = [0, 1, 2]  # split off before the death, without the victim
HOLDER = [1, 2, 3]  # holds the victim


def _raises_naming_victim(call: Callable[..., object], *args: object, **kwargs: object) -> None:
    """``call`` raises PeerError naming the victim (world rank)."""
    with pytest.raises(pg.PeerError) as info:
        call(*args, **kwargs)
    assert VICTIM in info.value.ranks, (info.value, info.value.ranks)


def _world_collectives_fail() -> None:
    """The world holds the victim: its collectives fail here, naming it. The first may
    still complete on a rank that had every contribution before the death."""
    with pytest.raises(pg.PeerError) as info:
        for _ in range(2):
            y = np.ones(8)
            pg.all_reduce(y)
    assert VICTIM in info.value.ranks, (info.value, info.value.ranks)
    _raises_naming_victim(pg.broadcast, np.ones(3), src=0)  # known at entry now
    _raises_naming_victim(pg.all_gather_object, [None] * SIZE, "x")
    assert pg.failed_ranks() == (VICTIM,)


def _report_group_works(report: pg.Group, rank: int) -> None:
    """A group without the victim: collectives and object collectives are exact."""
    x = np.full(1000, float(rank + 1))
    pg.all_reduce(x, group=report)
    assert np.all(x == 6.0), x[:3]
    r = np.full(5, float(rank))
    pg.reduce(r, dst=0, group=report)
    if rank == 0:
        assert np.all(r == 3.0), r
    b = np.full(4, float(rank))
    pg.broadcast(b, src=2, group=report)
    assert np.all(b == 2.0)
    gathered: list[object] = [None] * 3
    pg.all_gather_object(gathered, {"rank": rank}, group=report)
    assert gathered == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
    pg.barrier(group=report)


def _live_point_to_point(rank: int) -> None:
    """A ring among the live world ranks, and both directions with the dead one failing."""
    live = REPORT
    nxt, prv = live[(live.index(rank) + 1) % 3], live[(live.index(rank) - 1) % 3]
    got = np.empty(6)
    work = pg.isend(np.full(6, float(rank)), nxt, tag=3)
    assert pg.recv(got, src=prv, tag=3) == prv
    work.wait()
    assert np.all(got == prv)
    _raises_naming_victim(pg.send, np.ones(2), dst=VICTIM)
    _raises_naming_victim(pg.recv, np.ones(2), src=VICTIM)


def _any_source_needs_ack(report: pg.Group, rank: int) -> None:
    """Before the ack an any-source receive fails naming the victim; after it rank 0
    collects one result from each live worker."""
    assert pg.failure_get_acked() == []
    _raises_naming_victim(pg.recv, np.empty(2), tag=4)
    pg.failure_ack()
    assert pg.failure_get_acked() == [VICTIM]
    if rank == 0:
        senders = set()
        for _ in range(2):
            result = np.empty(2)
            sender = pg.recv(result, tag=5)
            assert np.all(result == sender * 10.0), (sender, result)
            senders.add(sender)
        assert senders == {1, 2}
    else:
        pg.send(np.full(2, rank * 10.0), dst=0, tag=5)
    pg.barrier(group=report)


def _holder_group(holder: pg.Group, rank: int) -> None:
    """A group holding the victim: collectives fail on each member, naming it; its
    any-source receives fail until acknowledged on that group, then hear the members."""
    if rank not in HOLDER:
        return
    _raises_naming_victim(pg.all_reduce, np.ones(4), group=holder)
    _raises_naming_victim(pg.recv, np.empty(1), group=holder, tag=6)
    assert pg.failure_get_acked(group=holder) == []
    pg.failure_ack(group=holder)
    assert pg.failure_get_acked(group=holder) == [HOLDER.index(VICTIM)]
    if rank == 1:
        got = np.empty(1)
        assert pg.recv(got, group=holder, tag=7) == 2
        assert got[0] == 22.0
    else:
        pg.send(np.full(1, 22.0), dst=1, group=holder, tag=7)
    _raises_naming_victim(pg.all_reduce, np.ones(4), group=holder)  # the ack does not heal collectives


def _revoke_the_world_report_on_the_side(report: pg.Group, rank: int) -> None:
    """The ULFM tutorial's revoke exercise: rank 0 revokes the world; every survivor's
    world ops then fail with GroupRevokedError, and the reporting group still reduces."""
    if rank == 0:
        pg.revoke()
    deadline = time.monotonic() + 60
    peer = REPORT[(REPORT.index(rank) + 1) % 3]
    while True:  # the revoke travels on the control plane: it arrives soon, not at once
        try:
            pg.send(np.ones(1), dst=peer, tag=8)
        except pg.GroupRevokedError:
            break
        assert time.monotonic() < deadline, "the revoke never arrived"
        time.sleep(0.01)
    total = np.full(3, float(rank + 1))
    pg.reduce(total, dst=0, group=report)
    if rank == 0:
        assert np.all(total == 6.0), total
    pg.barrier(group=report)


def scope_of_a_death(rank: int, size: int) -> object:
    report = pg.new_group(REPORT)
    holder = pg.new_group(HOLDER)
    x = np.ones(4)
    pg.all_reduce(x)
    assert x[0] == size
    if rank == VICTIM:
        time.sleep(0.3)  # what it sent last has left the host
        os._exit(3)
    _world_collectives_fail()
    _report_group_works(report, rank)
    _live_point_to_point(rank)
    _holder_group(holder, rank)
    _any_source_needs_ack(report, rank)
    _revoke_the_world_report_on_the_side(report, rank)
    return rank


TRANSPORTS = {
    "tcp-sockets": ("tcp", {"PROCGROUP_TCP_SHM": "0"}),
    "tcp-shm": ("tcp", {"PROCGROUP_TCP_SHM": "1"}),
    "gloo-pygloo": ("gloo", None),
    "gloo-torch": ("gloo", None),
}


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_a_death_fails_only_what_involves_the_dead_rank(transport: str) -> None:
    backend, env = TRANSPORTS[transport]
    if env is None:
        env = gloo_engine_env(transport.split("-")[1])
    results = spawn(scope_of_a_death, SIZE, backend, env=env, expect_dead=[VICTIM], timeout=600, job_timeout=180)
    assert results[:VICTIM] == [0, 1, 2]


# ---------------------------------------------------------------- the first failure wins
# Issue 30 item 5: an error that follows from an earlier death names that death. The
# ranks of this job: the victim dies; the leaver hears of it only from the detector,
# fails and exits at once without a goodbye (as a crashed or killed process); the slow
# rank is stopped (SIGSTOP) through all of it and resumed once the leaver is gone. It can
# learn of the death only from the detector's and the leaver's streams, which its threads
# then read in any order: the leaver's stream must carry the death before its end, or the
# slow rank blames the leaver. The victim is stopped too (its sockets to the leaver and
# the slow rank stay open and silent) after it cut its connection to the detector.
LEAVER, FIRST_VICTIM, SLOW, DETECTOR = 0, 1, 2, 3


def _state(pid: int) -> str:
    """A process's state letter (R, S, T stopped, Z exited), or "gone" once it is reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _wait_state(pid: int, *states: str) -> None:
    deadline = time.monotonic() + 60
    while _state(pid) not in states:
        assert time.monotonic() < deadline, f"process {pid} never reached state {states}"
        time.sleep(0.005)


def first_failure_wins(rank: int, size: int, out: str) -> object:
    pids: list[Any] = [None] * size
    pg.all_gather_object(pids, os.getpid())
    pg.barrier()
    Path(out, f"ready{rank}").touch()  # out of the barrier: a death now cannot fail it here
    if rank == SLOW:
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the detector once the leaver is gone
        try:
            got = np.empty(1)
            with pytest.raises(pg.PeerError) as info:  # the leaver vanished after the death: a consequence
                pg.recv(got, src=LEAVER)
            err = info.value
            assert err.rank == FIRST_VICTIM and err.ranks[:2] == (FIRST_VICTIM, LEAVER), (err, err.ranks)
            assert str(err).find(f"rank {FIRST_VICTIM}") < str(err).find(f"rank {LEAVER}"), err
            with pytest.raises(pg.PeerError) as info:  # a collective names the first death, not the lowest rank
                pg.all_reduce(np.ones(4))
            assert info.value.rank == FIRST_VICTIM, (info.value, info.value.ranks)
            assert f"rank {FIRST_VICTIM} of it failed" in str(info.value), info.value
            assert sorted(pg.failed_ranks()) == [LEAVER, FIRST_VICTIM], pg.failed_ranks()
            return str(err)
        finally:
            os.kill(int(pids[FIRST_VICTIM]), signal.SIGKILL)
    if rank == FIRST_VICTIM:
        deadline = time.monotonic() + 60
        while not all(Path(out, f"ready{r}").exists() for r in range(size)):
            assert time.monotonic() < deadline, "the others never left the barrier"
            time.sleep(0.005)
        _wait_state(int(pids[SLOW]), "T")
        pg.group_channel()._peers[DETECTOR].sock.shutdown(socket.SHUT_WR)  # its EOF; its reader here sees none
        os.kill(os.getpid(), signal.SIGSTOP)  # killed by the slow rank at the end
        return None
    _wait_state(int(pids[SLOW]), "T")
    with pytest.raises(pg.PeerError) as info:
        pg.all_reduce(np.ones(4))
    assert info.value.rank == FIRST_VICTIM, (info.value, info.value.ranks)
    if rank == LEAVER:
        os._exit(0)  # at once, without a goodbye
    _wait_state(int(pids[LEAVER]), "Z", "gone")
    os.kill(int(pids[SLOW]), signal.SIGCONT)
    return rank


def test_the_first_failure_wins(tmp_path: Path) -> None:
    """Every survivor names the first death, also one that hears of it only after a rank
    that left because of it: the slow rank's error on the leaver names the victim first."""
    env = {"PROCGROUP_TCP_SHM": "0", "PROCGROUP_HEARTBEAT_TIMEOUT": "120"}
    results = spawn(first_failure_wins, 4, "tcp", args=(str(tmp_path),), env=env,
                    expect_dead=[LEAVER, FIRST_VICTIM], timeout=120, job_timeout=90)
    assert results[DETECTOR] == DETECTOR
    assert f"rank {FIRST_VICTIM}" in results[SLOW], results


# ---------------------------------------------------------------- a departure first
# Issue 30 item 5, its Slurm case: rank 1 raises mid-job and leaves the way a program does
# (destroy_process_group: a goodbye, not a death); rank 0, in a receive from it, fails and
# leaves the same way; the survivors, each in an op with rank 0, must name rank 1 first.
# The held rank is stopped (SIGSTOP) through all of it and resumed once rank 0 is gone: its
# threads then read rank 1's and rank 0's goodbyes in any order, so it can name rank 1
# only if rank 0's stream carries rank 1's departure ahead of rank 0's goodbye.
QUITTER, FOLLOWER, HELD, WATCHER = 1, 0, 2, 3


def _leave_on_error(exc: BaseException, out: str, rank: int) -> None:
    """What a program does when an error ends it: its group is destroyed (goodbyes), then
    the process exits (no result: the test reads what it wrote)."""
    Path(out, f"error{rank}").write_text(f"{type(exc).__name__}|{getattr(exc, 'rank', '')}|{exc}")
    pg.destroy_process_group()
    os._exit(1)


def _names_the_quitter_first(err: pg.PeerError) -> None:
    assert err.rank == QUITTER and err.ranks[:2] == (QUITTER, FOLLOWER), (err, err.ranks)
    assert err.departed, err
    text = str(err)
    assert text.find(f"rank {QUITTER}") < text.find(f"rank {FOLLOWER}"), err
    assert "left first" in text, err


def departure_first(rank: int, size: int, out: str, held_op: str = "recv") -> object:
    pids: list[Any] = [None] * size
    pg.all_gather_object(pids, os.getpid())
    pair = pg.new_group([FOLLOWER, WATCHER])
    pg.barrier()
    Path(out, f"ready{rank}").touch()
    if rank == HELD:
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the watcher once the follower is gone
        with pytest.raises(pg.PeerError) as info:
            if held_op == "recv":
                pg.recv(np.empty(1), src=FOLLOWER)
            else:  # a world collective, on one host the shared-memory arena's: it waits on both
                pg.all_reduce(np.ones(1))
        if held_op == "recv":
            _names_the_quitter_first(info.value)
        else:  # whichever goodbye it finds first, the quitter is named first
            assert info.value.rank == QUITTER and info.value.departed, (info.value, info.value.ranks)
        return str(info.value)
    deadline = time.monotonic() + 60
    while not all(Path(out, f"ready{r}").exists() for r in range(size)):
        assert time.monotonic() < deadline, "the others never left the barrier"
        time.sleep(0.005)
    _wait_state(int(pids[HELD]), "T")
    if rank == QUITTER:
        try:
            raise RuntimeError("a bad batch in rank 1")
        except RuntimeError as exc:
            _leave_on_error(exc, out, rank)
    if rank == FOLLOWER:
        try:
            pg.recv(np.empty(1), src=QUITTER)
        except pg.PeerError as exc:
            _leave_on_error(exc, out, rank)
        os._exit(2)  # never: the receive cannot complete
    try:
        with pytest.raises(pg.PeerError) as info:  # the watcher: a collective with the follower
            pg.all_reduce(np.ones(4), group=pair)
    finally:
        _wait_state(int(pids[FOLLOWER]), "Z", "gone")
        os.kill(int(pids[HELD]), signal.SIGCONT)
    _names_the_quitter_first(info.value)
    return str(info.value)


@pytest.mark.parametrize(("shm", "held_op"), [("0", "recv"), ("1", "recv"), ("1", "world")],
                         ids=["sockets", "shm", "shm-arena-collective"])
def test_a_departure_is_the_first_failure(tmp_path: Path, shm: str, held_op: str) -> None:
    """Rank 1 raises and leaves; rank 0 fails on that and leaves: every survivor's error
    names rank 1 first and rank 0 as what followed, the held one's too (in a receive from
    rank 0, or in a world collective, which on one host runs in the shared-memory arena)."""
    env = {"PROCGROUP_TCP_SHM": shm, "PROCGROUP_HEARTBEAT_TIMEOUT": "120"}
    results = spawn(departure_first, 4, "tcp", args=(str(tmp_path), held_op), env=env,
                    expect_dead=[QUITTER, FOLLOWER], timeout=120, job_timeout=90)
    kind, blamed, text = (tmp_path / f"error{FOLLOWER}").read_text().split("|", 2)
    assert kind == "PeerError" and blamed == str(QUITTER), text  # the follower saw the quitter leave
    assert (tmp_path / f"error{QUITTER}").read_text().startswith("RuntimeError")
    for survivor in (HELD, WATCHER):
        assert f"rank {QUITTER} left first" in results[survivor], results


def clean_shutdown(rank: int, size: int) -> object:
    """Ranks 0-2 each send rank 3 a last result and leave; rank 3 sees their goodbyes
    first, then receives the results (what a rank wrote before its goodbye is delivered:
    on shared memory from its ring, past a refusal that is retried, not a failure), and
    no failure is recorded nor notice sent; then a receive from a rank that left names
    that rank alone."""
    x = np.full(4, float(rank))
    pg.all_reduce(x)
    assert x[0] == 6.0
    pg.barrier()
    deaths = pg.group_channel()._deaths
    if rank != size - 1:
        pg.send(np.full(2, float(rank)), dst=size - 1)
        assert deaths.first is None, deaths.first
        return rank
    peers = pg.group_channel()._peers
    deadline = time.monotonic() + 60
    while not all(p.left for p in peers.values()):
        assert time.monotonic() < deadline, "the others never said goodbye"
        time.sleep(0.01)
    for src in range(size - 1):
        got = np.zeros(2)
        pg.recv(got, src=src)
        assert got.tolist() == [float(src)] * 2, (src, got)
    assert deaths.first is None and not deaths.hurt_by_departure, deaths.first  # no notice came either
    with pytest.raises(pg.PeerError) as info:
        pg.recv(np.empty(1), src=0)
    err = info.value
    assert err.rank == 0 and err.ranks == (0,) and err.departed, (err, err.ranks)
    assert "first" not in str(err), err
    return str(err)


@pytest.mark.parametrize("shm", ["0", "1"], ids=["sockets", "shm"])
def test_a_clean_shutdown_names_no_first_failure(shm: str) -> None:
    """Goodbyes alone are no failure: no notice, no first failure; the first op a departure
    then fails names that departure only."""
    results = spawn(clean_shutdown, 4, "tcp", env={"PROCGROUP_TCP_SHM": shm}, timeout=60, job_timeout=90)
    assert results[:3] == [0, 1, 2]
    assert "rank 0 has left the group" in results[3], results


def test_a_departure_notice_naming_no_other_member_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """A peer-left notice is trusted only as far as it names another member: one naming a
    rank outside the group, the receiver or the teller itself is logged and ignored (no
    first failure, the channel goes on); an oversized one breaks that connection, naming
    the sender. A real channel (rank 0) and a raw socket holding the token (rank 1)."""
    from procgroup.rendezvous import HashStore
    from procgroup_tcp import _wire
    from test_security_tcp import _seat_raw

    def notice(seq: int, rank: int, body: bytes = b"") -> bytes:
        body = body or _wire.pack_lost(rank, f"rank {rank} has left the group")
        return _wire.pack_header(_wire.KIND_PEER_LEFT, b"B", 0, seq, len(body)) + body

    ch, sock = _seat_raw(HashStore())
    assert not isinstance(ch, BaseException), ch
    try:
        with caplog.at_level("WARNING", logger="procgroup_tcp._faults"):
            sock.sendall(notice(0, 7) + notice(1, 0) + notice(2, 1) + notice(3, -(2**63)))
            data = np.arange(4, dtype=np.uint8)
            sock.sendall(_wire.pack_header(_wire.KIND_DATA, b"B", 0, 4, 4) + data.tobytes())
            got = np.empty(4, dtype=np.uint8)
            ch.recv(got, 1, 0)
        assert np.array_equal(got, data)
        assert ch._deaths.first is None, ch._deaths.first
        ignored = [r for r in caplog.records if "departure notice naming rank" in r.getMessage()]
        assert len(ignored) == 4, [r.getMessage() for r in caplog.records]
        sock.sendall(_wire.pack_header(_wire.KIND_PEER_LEFT, b"B", 0, 5, _wire.MAX_LOST_BYTES + 1))
        with pytest.raises(pg.PeerError) as info:
            ch.recv(np.empty(1, dtype=np.uint8), 1, 0)
        assert info.value.rank == 1 and "unknown kind" in str(info.value), info.value
    finally:
        ch.close()
        sock.close()
