"""asyncio: every Work is awaitable without blocking the event loop, on every backend.

Each job starts its ranks once; every rank runs one real event loop (``asyncio.run``) with
a ticker task beside the awaits, and reports what it saw: the values, the errors raised at
the ``await``, and how often the ticker ran while an await waited for a peer that was
made late on purpose (a blocking wait would let it run zero times).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _installed import gloo_engine_env, require_mpi
from test_master_worker import launch, results_of

from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)

#: how late (seconds) a rank joins on purpose, so that its peer's await has to wait
LATE_S = 0.4
#: the group timeout of the job that checks it
TIMEOUT_S = 3.0
#: the ticker's period (seconds): a responsive loop ticks many times while an await waits
TICK_S = 0.002


async def _ticking(awaitable: Any) -> tuple[Any, int]:
    """Await ``awaitable`` beside a ticker task; its result and how often the ticker ran."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(TICK_S)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker starts before the await
    try:
        value = await awaitable
    finally:
        task.cancel()
    return value, ticks


async def _checks(rank: int, size: int) -> dict[str, Any]:
    import procgroup as pg
    from procgroup.errors import ProcGroupError

    out: dict[str, Any] = {}
    peer = 1 - rank if rank < 2 else None

    # an irecv whose sender is late: the loop keeps running while the receive waits
    pg.barrier()  # both start together, so the receiver really waits LATE_S
    if peer is not None:
        if rank == 0:
            time.sleep(LATE_S)  # blocks this rank on purpose: its peer's await waits
            pg.send(np.arange(4.0), dst=1)
        else:
            buf = np.zeros(4)
            _, ticks = await _ticking(pg.irecv(buf, src=0))
            out["recv"] = buf.tolist()
            out["recv_ticks"] = ticks
    # a collective one rank joins late
    x = np.full(3, float(rank + 1))
    pg.barrier()
    if rank == size - 1:
        time.sleep(LATE_S)
    _, out["allreduce_ticks"] = await _ticking(pg.all_reduce(x, async_op=True))
    out["allreduce"] = x.tolist()

    # gather over several Works of several kinds (collectives and point-to-point)
    arrays = [np.full(2, float(rank + k)) for k in range(3)]
    works = [pg.all_reduce(a, async_op=True) for a in arrays]
    works.append(pg.broadcast(b := np.full(2, float(rank)), src=size - 1, async_op=True))
    got = np.zeros(1)
    if peer is not None:
        works.append(pg.isend(np.array([10.0 + rank]), dst=peer))
        works.append(pg.irecv(got, src=peer))
    results = await asyncio.gather(*works)
    out["gather_results"] = [bool(r) for r in results]
    out["gathered"] = [a.tolist() for a in arrays] + [b.tolist(), got.tolist()]

    # a staged CUDA array (host-backed FakeGpuArray): the await runs the Work's finishing
    # step, the copy back into the caller's array
    from procgroup.testing import FakeGpuArray

    staged = FakeGpuArray(np.full(3, float(rank + 1)))
    await pg.all_reduce(staged, async_op=True)
    out["staged"] = staged.get().tolist()

    # the op's error is raised at the await: a receive too small for what its peer sends
    if peer is not None:
        if rank == 0:
            pg.send(np.arange(8.0), dst=1, tag=7)
        else:
            try:
                await pg.irecv(np.zeros(2), src=0, tag=7)
                out["too_small"] = "no error"
            except ProcGroupError as exc:
                out["too_small"] = type(exc).__name__
    pg.barrier()

    # asyncio.wait_for bounds one await; the op goes on and a later await completes it
    if peer is not None:
        if rank == 0:
            time.sleep(LATE_S)
            pg.send(np.ones(2), dst=1, tag=8)
        else:
            buf = np.zeros(2)
            work = pg.irecv(buf, src=0, tag=8)
            try:
                await asyncio.wait_for(work, 0.05)
                out["bounded"] = "finished early"
            except asyncio.TimeoutError:
                out["bounded"] = "timed out"
            await work
            out["after_bounded"] = buf.tolist()
    pg.barrier()
    return out


def _rank_main(rank: int, size: int) -> dict[str, Any]:
    return asyncio.run(_checks(rank, size))


def _check(results: list[dict[str, Any]]) -> None:
    size = len(results)
    total = float(sum(range(1, size + 1)))
    for rank, out in enumerate(results):
        assert out["allreduce"] == [total] * 3
        assert out["gather_results"] == [True] * len(out["gather_results"])
        expect = [[float(sum(r + k for r in range(size)))] * 2 for k in range(3)]
        expect.append([float(size - 1)] * 2)
        expect.append([10.0 + (1 - rank)] if rank < 2 else [0.0])
        assert out["gathered"] == expect, rank
        assert out["staged"] == [total] * 3, rank
    # the late rank's peers ticked while their await waited: the loop was not blocked
    assert results[0]["allreduce_ticks"] >= 5, results
    r1 = results[1]
    assert r1["recv"] == [0.0, 1.0, 2.0, 3.0]
    assert r1["recv_ticks"] >= 5, r1
    assert r1["too_small"] not in ("no error",), r1
    assert r1["bounded"] == "timed out"
    assert r1["after_bounded"] == [1.0, 1.0]


def test_await_on_tcp() -> None:
    _check(spawn(_rank_main, 3, "tcp", timeout=60.0, job_timeout=180.0))


def test_await_on_mpi() -> None:
    require_mpi()
    _check(spawn(_rank_main, 2, "mpi", launcher="mpiexec", init_method=None, timeout=60.0, job_timeout=180.0))


@pytest.mark.parametrize("engine", ["torch", "pygloo"])
def test_await_on_gloo(engine: str) -> None:
    # pygloo holds the GIL inside its calls, so no Python thread (the loop's either) runs
    # while one waits; the arrival check makes the wait for a late rank happen in Python
    # first (on by default below a 30 s group timeout; docs/asyncio.md)
    env = {**gloo_engine_env(engine), "PROCGROUP_GLOO_ARRIVAL_CHECK": "always"}
    _check(spawn(_rank_main, 2, "gloo", init_method="tcp", timeout=60.0, job_timeout=180.0, env=env))


# ------------------------------------------------------------ the group's timeout holds


def _never_sent(rank: int, size: int) -> dict[str, Any]:
    import procgroup as pg
    from procgroup.errors import CommTimeoutError

    async def main() -> dict[str, Any]:
        out: dict[str, Any] = {}
        if rank == 1:
            start = time.monotonic()
            try:
                _, out["ticks"] = await _ticking(pg.irecv(np.zeros(1), src=0, tag=3))
                out["error"] = None
            except CommTimeoutError as exc:
                out["error"] = str(exc)
            out["waited"] = time.monotonic() - start
        else:
            time.sleep(TIMEOUT_S + 1.5)  # alive (a rank that left would be the error) and silent
        pg.barrier()
        return out

    return asyncio.run(main())


@pytest.mark.parametrize("backend", ["tcp", "mpi"])
def test_await_ends_at_the_group_timeout(backend: str) -> None:
    """An await whose peer never sends raises CommTimeoutError after the group's timeout,
    as a blocking wait does (here 3 s), instead of waiting forever."""
    kwargs: dict[str, Any] = {}
    if backend == "mpi":
        require_mpi()
        kwargs = {"launcher": "mpiexec", "init_method": None}
    results = spawn(_never_sent, 2, backend, timeout=TIMEOUT_S, job_timeout=120.0, **kwargs)
    out = results[1]
    assert out["error"] is not None and "timeout" in out["error"], out
    assert out["waited"] >= 2.5, out


# ------------------------------------------------------------ master-worker's sync points


MW_CHECKS = Path(__file__).parent / "mw_asyncio_checks.py"


@pytest.mark.parametrize("backend", ["tcp"])
def test_master_worker_sync_points_await(backend: str) -> None:
    """get_async, synchronize_async (module, Stream, Event) under a real loop: values,
    gather across two nodes, the loop ticking while a slow remote function runs, and a
    worker's failure raised at the await."""
    ranks = launch(MW_CHECKS, 3, env={"MW_BACKEND": backend})
    code, out, err = ranks[0]
    results = results_of(out, err)
    assert set(results) == {"get_async", "gather_across_nodes", "streams_and_events_async",
                            "errors_at_the_await"}, results
    failed = {name: tb for name, tb in results.items() if tb is not None}
    assert not failed, "\n".join(f"{name}:\n{tb}" for name, tb in failed.items())
    assert code == 0, err[-3000:]
