"""Master-worker's awaitable sync points under a real event loop, run as a script by
tests/test_asyncio.py (a master and two nodes, real processes).

Every rank runs this file; rank 0 returns from init_master_worker and runs the checks,
printing one JSON line (tests/_mw_run.py). The functions remote.run ships are defined
before init_master_worker, so the workers can unpickle them.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

import numpy as np
import procgroup as pg
from _mw_run import Checks

#: how long (seconds) a remote function makes the master's await wait
SLOW_S = 0.4
TICK_S = 0.002


def slow_value(seconds: float, value: Any) -> Any:
    time.sleep(seconds)
    return value


def slow_fill(x: np.ndarray, seconds: float, value: float) -> None:
    time.sleep(seconds)
    x[...] = value


pg.init_master_worker(os.environ.get("MW_BACKEND") or None)

# ---------------------------------------------------------------- only the master gets here
R = pg.remote
checks = Checks()
check = checks.register


async def ticking(awaitable: Any) -> tuple[Any, int]:
    """Await beside a ticker task: the result and how often the ticker ran meanwhile."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(TICK_S)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        return await awaitable, ticks
    finally:
        task.cancel()


@check
def get_async() -> None:
    async def main() -> None:
        x = R.arange(6.0)
        got, _ = await ticking((x * 2).get_async())
        assert got.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], got
        value, ticks = await ticking(R.run_async(slow_value, SLOW_S, {"k": 7}).get_async())
        assert value == {"k": 7}, value
        assert ticks >= 5, f"the loop ran {ticks} times while RemoteValue.get_async waited"
        y = R.zeros(4)
        R.run_async(slow_fill, y, SLOW_S, 3.0)  # in order on the stream; returns at once
        got, ticks = await ticking(y.get_async())
        assert got.tolist() == [3.0] * 4 and ticks >= 5, (got, ticks)

    asyncio.run(main())


@check
def gather_across_nodes() -> None:
    async def main() -> None:
        arrays = [R.full(3, float(k + 1), node=k) for k in range(R.num_nodes())]
        got = await asyncio.gather(*(a.get_async() for a in arrays), R.synchronize_async(0),
                                   R.synchronize_async(1))
        assert [g.tolist() for g in got[:2]] == [[1.0] * 3, [2.0] * 3], got

    asyncio.run(main())


@check
def streams_and_events_async() -> None:
    async def main() -> None:
        s = R.Stream()
        y = R.zeros(2)
        with s:
            R.run_async(slow_fill, y, SLOW_S, 5.0)
            ev = R.Event()
            ev.record()
        _, ticks = await ticking(ev.synchronize_async())
        assert ticks >= 5, f"the loop ran {ticks} times while Event.synchronize_async waited"
        assert ev.query()
        with s:
            R.run_async(slow_fill, y, 0.05, 6.0)
        await s.synchronize_async()
        assert s.query()
        assert y.get().tolist() == [6.0, 6.0]

    asyncio.run(main())


@check
def errors_at_the_await() -> None:
    async def main() -> None:
        bad = R.empty(1 << 44, np.uint8)  # 16 TiB: the worker's allocation fails
        derived = bad[:10] + 1  # issued without waiting: the error comes at the sync point
        try:
            await derived.get_async()
        except pg.RemoteError as exc:
            assert exc.node == 0, vars(exc)
        else:
            raise AssertionError("get_async of an array whose allocation failed did not raise")

    asyncio.run(main())


checks.run(sys.argv[1:])
