"""Who reads the sockets (procgroup_tcp._progress): the waiting caller, else a reader thread.

On the socket path (PROCGROUP_TCP_SHM=0) a blocking receive reads its peer's frames on
the caller's thread, a small one lands unposted in the caller's array, and each peer's
reader thread reads only while no caller does. These jobs check the rules that must
hold whoever reads: order per (source, tag) with posted receives and the unexpected
queue, any-source, is_completed without a wait, short waits, size and dtype errors that
keep the stream in step, several threads on one peer, an idle rank that still drains a
large send, two ranks sending large messages to each other, a death and a frozen rank
seen by a rank that is reading another peer, and a slow rank that is not counted dead.
One job per world size runs many checks.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

from procgroup.testing import spawn

SOCKETS = {"PROCGROUP_TCP_SHM": "0"}


def _rules(rank: int, size: int) -> dict[str, Any]:
    import procgroup as pg
    from procgroup.errors import CommTimeoutError, InvalidArrayError, PeerError

    out: dict[str, Any] = {}
    one = np.zeros(1)
    big = 100_000  # float64: 800 KB, above the unposted-receive limit (64 KiB)
    # 1. order per (source, tag): tag 6 first, so both tag-5 messages wait (queued or in the
    # kernel); sizes on both sides of the unposted limit
    if rank == 1:
        pg.send(np.full(3, 1.0), 0, tag=5)
        pg.send(np.full(big, 2.0), 0, tag=5)
        pg.send(np.full(3, 3.0), 0, tag=6)
    elif rank == 0:
        a, b, c = np.zeros(3), np.zeros(big), np.zeros(3)
        pg.recv(c, 1, tag=6)
        pg.recv(a, 1, tag=5)
        pg.recv(b, 1, tag=5)
        out["order"] = (a[0], b[0], b[-1], c[0])
    pg.barrier()
    # 2. an irecv posted before a blocking recv of the same tag gets the first message
    if rank == 1:
        pg.send(np.full(2, 1.0), 0, tag=7)
        pg.send(np.full(2, 2.0), 0, tag=7)
    elif rank == 0:
        first, second = np.zeros(2), np.zeros(2)
        work = pg.irecv(first, 1, tag=7)
        pg.recv(second, 1, tag=7)
        work.wait()
        out["posted_first"] = (first[0], second[0])
    pg.barrier()
    # 3. any-source hears every peer
    if rank == 0:
        got = sorted(pg.recv(one, None, tag=8) for _ in range(size - 1))
        out["any_source"] = got
    else:
        pg.send(np.full(1, float(rank)), 0, tag=8)
    pg.barrier()
    # 4. is_completed alone makes progress (no wait), even right after a blocking recv
    if rank == 1:
        time.sleep(0.05)
        pg.send(np.full(1, 4.0), 0, tag=9)
    elif rank == 0:
        work = pg.irecv(one, 1, tag=9)
        deadline = time.monotonic() + 20
        while not work.is_completed() and time.monotonic() < deadline:
            pass
        out["polled"] = (work.is_completed(), one[0])
    pg.barrier()
    # 5. a short wait times out, the receive stays posted and completes later
    if rank == 0:
        work = pg.irecv(one, 1, tag=10)
        try:
            work.wait(timeout=0.05)
            out["short_wait"] = "no timeout"
        except CommTimeoutError:
            pg.send(np.zeros(1), 1, tag=11)  # now rank 1 sends
            work.wait()
            out["short_wait"] = one[0]
    elif rank == 1:
        pg.recv(np.zeros(1), 0, tag=11)
        pg.send(np.full(1, 5.0), 0, tag=10)
    pg.barrier()
    # 6. a frame of the wrong size or dtype fails that receive only; the stream stays in step
    if rank == 1:
        pg.send(np.zeros(2), 0, tag=12)  # larger than the buffer
        pg.send(np.zeros(1, dtype=np.float32), 0, tag=12)  # another dtype
        pg.send(np.full(1, 6.0), 0, tag=12)
    elif rank == 0:
        errors = []
        for _ in range(2):
            try:
                pg.recv(one, 1, tag=12)
            except (PeerError, InvalidArrayError) as exc:
                errors.append(type(exc).__name__)
        pg.recv(one, 1, tag=12)
        out["refused"] = (errors, one[0])
    pg.barrier()
    # 7. two threads receive from one peer at once (one reads, the other is served)
    if rank == 1:
        for i in range(50):
            pg.send(np.full(1, float(i)), 0, tag=20 + i % 2)
    elif rank == 0:
        seen: dict[int, list[float]] = {20: [], 21: []}

        def take(tag: int) -> None:
            buf = np.zeros(1)
            for _ in range(25):
                pg.recv(buf, 1, tag=tag)
                seen[tag].append(buf[0])

        threads = [threading.Thread(target=take, args=(t,)) for t in (20, 21)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        out["threads"] = (seen[20] == [float(i) for i in range(0, 50, 2)],
                          seen[21] == [float(i) for i in range(1, 50, 2)])
    pg.barrier()
    # 8. an idle rank (not in procgroup) drains a large send: the sender's blocking send
    # ends while the receiver sleeps, so the receiver's reader thread read it
    large = np.full(8 << 20, 1.0)
    if rank == 0:
        pg.recv(one, 1, tag=30)  # then idle
        time.sleep(2.0)
        pg.recv(large, 1, tag=31)
        out["idle_drained"] = bool(large[0] == 8.0)
    elif rank == 1:
        pg.send(one, 0, tag=30)
        start = time.monotonic()
        pg.send(np.full(8 << 20, 8.0), 0, tag=31)  # 64 MiB: far above the kernel's buffers
        out["idle_send_seconds"] = time.monotonic() - start
    pg.barrier()
    # 9. two ranks send large messages to each other, then receive: no deadlock
    if rank in (0, 1):
        mine, theirs = np.full(4 << 20, float(rank)), np.zeros(4 << 20)
        pg.send(mine, 1 - rank, tag=40)
        pg.recv(theirs, 1 - rank, tag=40)
        out["crossed"] = bool(np.all(theirs == 1 - rank))
    pg.barrier()
    return out


def test_the_receive_rules_hold_whoever_reads() -> None:
    results = spawn(_rules, 3, env=SOCKETS, timeout=60.0)
    r0, r1 = results[0], results[1]
    assert r0["order"] == (1.0, 2.0, 2.0, 3.0)
    assert r0["posted_first"] == (1.0, 2.0)
    assert r0["any_source"] == [1, 2]
    assert r0["polled"] == (True, 4.0)
    assert r0["short_wait"] == 5.0
    assert r0["refused"] == (["PeerError", "InvalidArrayError"], 6.0)
    assert r0["threads"] == (True, True)
    assert r0["idle_drained"] and r1["idle_send_seconds"] < 1.5, r1
    assert r0["crossed"] and r1["crossed"]


def _death_seen_while_reading(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 reads rank 1 (alive) while rank 2 dies; rank 1 reads rank 2.

    As in ULFM, the death fails only what involves rank 2: rank 1's receive from it, not
    rank 0's receive from rank 1. Rank 0 still takes the death in while its thread reads
    rank 1's socket: its receive from rank 2 afterwards fails at once."""
    import procgroup as pg

    buf = np.zeros(4)
    pg.barrier()
    if rank == 2:  # dies once every rank is past the barrier, and is reading below
        for r in range(2):
            pg.recv(np.zeros(1), r, tag=77)
        time.sleep(0.3)
        os._exit(3)
    pg.send(np.ones(1), 2, tag=77)
    if rank == 1:
        with pytest.raises(pg.PeerError) as info:
            pg.recv(buf, src=2)
        pg.send(np.full(4, 5.0), 0)
        return {"error": str(info.value), "ranks": tuple(info.value.ranks)}
    pg.recv(buf, src=1)
    start = time.monotonic()
    with pytest.raises(pg.PeerError) as info:
        pg.recv(np.zeros(1), src=2)
    return {"error": str(info.value), "ranks": tuple(info.value.ranks), "got": buf.tolist(),
            "seconds": time.monotonic() - start, "failed": list(pg.failed_ranks())}


def test_a_death_reaches_a_rank_reading_another_peer() -> None:
    results = spawn(_death_seen_while_reading, 3, env=SOCKETS, expect_dead=[2], timeout=600, job_timeout=60)
    for r in (results[0], results[1]):
        assert 2 in r["ranks"] and "rank 2" in r["error"], r
    assert results[0]["got"] == [5.0] * 4 and results[0]["failed"] == [2], results[0]
    assert results[0]["seconds"] < 5.0, results[0]


def _frozen_while_read(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 reads rank 1 while it is slow (heartbeats go on), then ranks 0 and 1 read
    rank 2 while it is stopped."""
    import procgroup as pg

    pids = [None] * size
    pg.all_gather_object(pids, os.getpid())
    one = np.zeros(1)
    if rank == 1:
        time.sleep(3.0)  # slow, not dead: twice the deadline, its heartbeat thread goes on
        pg.send(one, 0)
    elif rank == 0:
        pg.recv(one, 1)  # read by this thread, heartbeats included
    pg.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(pg.PeerError) as info:
        pg.recv(one, 2)
    if rank == 0:
        os.kill(pids[2], signal.SIGKILL)  # type: ignore[arg-type]  # pids came back as a list of ints
    return {"seconds": time.monotonic() - start, "ranks": tuple(info.value.ranks)}


def test_a_frozen_rank_is_dead_to_the_rank_reading_it_and_a_slow_one_is_not() -> None:
    env = {**SOCKETS, "PROCGROUP_HEARTBEAT_TIMEOUT": "1.5"}
    results = spawn(_frozen_while_read, 3, env=env, expect_dead=[2], timeout=600, job_timeout=60)
    for r in (results[0], results[1]):
        assert 2 in r["ranks"] and r["seconds"] < 10.0, r
