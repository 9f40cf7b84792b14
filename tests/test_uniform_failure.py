"""PROCGROUP_UNIFORM_FAILURE=1: a collective fails on every survivor or on none.

Without it, the collective in flight when a rank dies may complete on one survivor and
fail on another (docs/fault-tolerance.md, "The model"). With it, each collective ends
with the survivors' agreement, so every survivor raises for the same collective, whose
number on the group is ``error.seq``. Real processes over tcp (both paths) and gloo;
mpi, which cannot agree after a death, refuses the setting at init.
"""

from __future__ import annotations

import os

import numpy as np
import procgroup as pg
import pytest
from _installed import require_gloo
from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)

UNIFORM = {"PROCGROUP_UNIFORM_FAILURE": "1"}
PATHS = {"sockets": {"PROCGROUP_TCP_SHM": "0"}, "shm": {"PROCGROUP_TCP_SHM": "1"}}


def ordinary_ops(rank: int, size: int) -> dict[str, object]:
    """Every kind of op gives its exact result; async collectives come back completed."""
    assert pg.group_channel().uniform_failure
    x = np.full(1000, float(rank + 1))
    pg.all_reduce(x)  # the core's fast path
    pg.all_reduce(x)  # ... taken from the second call on
    total = size * (size + 1) / 2
    assert np.all(x == total * size), x[:3]
    work = pg.all_reduce(np.ones(3, np.float32), async_op=True)
    assert work is not None and work.is_completed() and work.wait()
    b = np.full(5, float(rank))
    pg.broadcast(b, src=size - 1)
    assert np.all(b == size - 1)
    outs = [np.zeros(2) for _ in range(size)]
    pg.all_gather(outs, np.full(2, float(rank)))
    assert [float(o[0]) for o in outs] == [float(r) for r in range(size)]
    pg.barrier()
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = np.empty(4)
    work = pg.isend(np.full(4, float(rank)), nxt)
    pg.recv(got, prv)
    work.wait()
    assert np.all(got == prv)
    sub = pg.new_group([0, size - 1])
    if rank in (0, size - 1):
        y = np.ones(2)
        pg.all_reduce(y, group=sub)
        assert np.all(y == 2.0)
    return {"rank": rank}


@pytest.mark.parametrize("path", ["sockets", "shm"])
def test_ordinary_ops_are_exact(path: str) -> None:
    results = spawn(ordinary_ops, 3, "tcp", env={**UNIFORM, **PATHS[path]}, timeout=60)
    assert [r["rank"] for r in results] == [0, 1, 2]


def death_mid_stream(rank: int, size: int, victim: int, last: int) -> dict[str, object]:
    """The victim exits the instant its collective ``last`` returned (what it had not sent
    yet may be lost with it): every survivor must fail the same collective."""
    pg.barrier()  # collective #0
    x = np.ones(1 << 14)
    seq = None
    message = ""
    done = 0
    try:
        for n in range(1, 400):
            if n % 3:
                x[:] = 1.0
                pg.all_reduce(x)
                assert np.all(x == size), x[:3]
            else:
                x[:] = float(rank)
                pg.broadcast(x, src=n % size)
                assert np.all(x == n % size), x[:3]
            done = n
            if rank == victim and n == last:
                os._exit(3)
    except pg.ProcGroupError as exc:
        seq = exc.seq
        message = str(exc)
        kind = type(exc).__name__
    assert seq is not None, "the survivors went on past a death"
    pg.shrink(timeout=60)
    y = np.ones(3)
    pg.all_reduce(y)
    return {"seq": seq, "done": done, "kind": kind, "message": message, "after": float(y[0])}


@pytest.mark.parametrize("path", ["sockets", "shm"])
def test_every_survivor_fails_the_same_collective(path: str) -> None:
    size, victim, last = 4, 2, 37
    results = spawn(death_mid_stream, size, "tcp", args=(victim, last), env={**UNIFORM, **PATHS[path]},
                    expect_dead=[victim], timeout=60, job_timeout=200)
    alive = [r for i, r in enumerate(results) if i != victim]
    seqs = {r["seq"] for r in alive}
    assert len(seqs) == 1, alive  # the same collective on every survivor
    (seq,) = seqs
    # the victim joined collectives 0..last; the first it missed, or the one it died in
    assert seq in (last, last + 1), alive
    for r in alive:
        assert r["done"] == seq - 1, r  # no survivor completed the failed one
        assert f"collective #{seq} of this group" in r["message"], r
        assert r["kind"] in ("PeerError", "GroupRevokedError"), r
        assert r["after"] == size - 1, r


def gloo_death(rank: int, size: int) -> dict[str, object]:
    return death_mid_stream(rank, size, 1, 11)


def test_gloo_survivors_fail_the_same_collective() -> None:
    require_gloo()
    results = spawn(gloo_death, 3, "gloo", env=UNIFORM, expect_dead=[1], timeout=60, job_timeout=200)
    alive = [results[0], results[2]]
    assert alive[0]["seq"] == alive[1]["seq"] in (11, 12), alive
    assert all(r["after"] == 2.0 for r in alive), alive


def mpi_refuses(rank: int, size: int) -> str:
    with pytest.raises(pg.errors.UnsupportedOperationError) as info:
        pg.init_process_group("mpi")
    return str(info.value)


def test_mpi_refuses_uniform_failure_at_init() -> None:
    pytest.importorskip("mpi4py", reason="the mpi backend needs mpi4py")
    messages = spawn(mpi_refuses, 2, "mpi", launcher="mpiexec", init_method=None, env=UNIFORM, init=False,
                     timeout=60)
    for msg in messages:
        assert "PROCGROUP_UNIFORM_FAILURE=1 needs the survivors' agreement" in msg, msg
        assert "the mpi backend cannot agree after a death" in msg, msg
