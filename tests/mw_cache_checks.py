"""The worker's caching allocator (procgroup.remote._cache), run as a script by
tests/test_remote_cache.py with real processes: a master and two nodes.

Every rank runs this file; rank 0 returns from init_master_worker and runs the checks
named on the command line, printing one JSON line: {check: null | traceback}. Whether a
block was reused is read on the worker: the data address of an array (``address``).
MW_CACHE_BYTES tells the checks the limit the job was started with.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

import numpy as np
import procgroup as pg
from _mw_run import Checks

_FLAG = threading.Event()
_KEPT: list[np.ndarray] = []


def address(x: np.ndarray) -> int:
    return int(x.__array_interface__["data"][0])


def owns_data(x: np.ndarray) -> bool:
    return bool(x.flags.owndata)


def keep(x: np.ndarray) -> None:
    """A remote.run function that keeps a view of its argument after it returned."""
    _KEPT.append(x[::2])


def kept_sum() -> float:
    return float(sum(float(k.sum(dtype=np.float64)) for k in _KEPT))


def drop_kept() -> None:
    _KEPT.clear()


def wait_for_flag(seconds: float) -> bool:
    ok = _FLAG.wait(seconds)
    _FLAG.clear()
    return ok


def set_flag() -> None:
    _FLAG.set()


BACKEND = os.environ.get("MW_BACKEND") or "tcp"
pg.init_master_worker(BACKEND)

# ---------------------------------------------------------------- only the master gets here
R = pg.remote
LIMIT = int(os.environ["MW_CACHE_BYTES"])
N = 1 << 18  # float32: 1 MiB, the smallest size the cache takes
MIB = 1 << 20
checks = Checks()
check = checks.register


def addr(x: R.RemoteArray) -> int:
    return int(R.run(address, x).get())


def cached(node: int = 0) -> int:
    return int(R.memory_info(node)["cached_bytes"])


def pattern(seed: int, n: int = N) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) * 7 + seed) % 1009


def fresh_start(node: int = 0) -> None:
    """No garbage left from an earlier check, an empty cache."""
    gc.collect()
    R.empty_cache(node)
    assert cached(node) == 0


@check
def reuse_only_when_no_view_is_alive() -> None:
    fresh_start()
    a = R.send(pattern(1))  # received into a block of the cache
    assert not R.run(owns_data, a).get(), "remote.send's array did not come from the cache"
    pa = addr(a)
    v = a.reshape(512, 512).T[::2]  # a view made on the worker
    del a
    gc.collect()
    assert cached() == 0, "a block whose view is alive went back to the cache"
    others = [R.empty(N, np.float32) for _ in range(3)] + [R.zeros(N, np.float32), R.full(N, 5.0, np.float32)]
    for k, o in enumerate(others):
        o[...] = float(-k)  # written while the view lives
    assert pa not in {addr(o) for o in others}, "the memory of a live view was handed out again"
    expect = pattern(1).reshape(512, 512).T[::2]
    assert np.array_equal(v.get(), expect), "a live view's data changed"
    for k, o in enumerate(others):
        assert np.array_equal(o.get(), np.full(N, float(-k), np.float32))
    del others, o
    gc.collect()
    assert cached() == 5 * MIB, cached()
    del v  # the last user of a's block: now it returns, and is the next one out (last in, first out)
    gc.collect()
    assert cached() == 6 * MIB, cached()
    b = R.empty(N, np.float32)
    assert addr(b) == pa, "a freed block with no view left was not reused"
    z = R.zeros(N, np.float32)  # a reused, dirty block: zeros must still be zeros
    assert not R.run(owns_data, z).get()
    assert not z.any().get() and float(z.sum()) == 0.0
    o = R.ones((512, 512), np.float32)
    f = R.full((256, 1024), np.arange(1024, dtype=np.float32), np.float32)
    assert np.array_equal(o.get(), np.ones((512, 512), np.float32))
    assert np.array_equal(f.get(), np.broadcast_to(np.arange(1024, dtype=np.float32), (256, 1024)))
    info = R.memory_info()
    assert info["arrays"] == 4 and info["bytes"] == 4 * MIB, info  # what the master holds, unchanged


@check
def a_run_function_that_kept_an_array_keeps_its_block() -> None:
    fresh_start()
    a = R.send(pattern(2))
    pa = addr(a)
    R.run(keep, a)
    del a
    gc.collect()
    assert cached() == 0
    others = [R.full(N, 3.0, np.float32) for _ in range(4)]
    assert pa not in {addr(o) for o in others}
    assert R.run(kept_sum).get() == float(pattern(2)[::2].sum(dtype=np.float64))
    R.run(drop_kept)
    assert cached() == MIB, "the block came not back once the function's array was dropped"
    assert addr(R.empty(N, np.float32)) == pa
    del others


@check
def a_queued_send_on_another_stream_keeps_its_block() -> None:
    fresh_start()
    fresh_start(1)
    a = R.send(pattern(3))
    pa = addr(a)
    s1, s2 = pg.Stream(), pg.Stream()
    with s1:
        blocked = R.run_async(wait_for_flag, 30.0)  # s1 waits until s2 sets the flag
        moved = a.to(1)  # its send is queued on s1 behind the wait
    del a
    gc.collect()
    others = [R.full(N, -1.0, np.float32) for _ in range(4)]  # on the default stream, meanwhile
    assert pa not in {addr(o) for o in others}, "a block with a send queued on it was handed out"
    with s2:
        R.run_async(set_flag)
    assert blocked.get() is True
    assert np.array_equal(moved.get(), pattern(3)), "the queued send moved other data"
    pg.synchronize(0)
    assert cached() == MIB, "the block came not back once its send was done"


@check
def results_stay_exact_across_many_to_and_free_cycles() -> None:
    fresh_start(0)
    fresh_start(1)
    seen: set[int] = set()
    for i in range(40):
        src = pattern(i, 2 * N)  # 2 MiB: the READY rendezvous of .to()
        a = R.send(src, node=0)
        b = a.to(1)
        assert not R.run(owns_data, b).get(), ".to()'s result did not come from the cache"
        seen.add(addr(b))
        c = b * 2  # computed on the worker, then freed with the rest
        back = c.to(0)
        assert np.array_equal(b.get(), src), f"cycle {i}: .to() moved wrong data"
        assert np.array_equal(back.get(), src * 2), f"cycle {i}: the way back moved wrong data"
        assert np.array_equal(a.get(), src), f"cycle {i}: the source changed"  # a and back: both cached
        del a, b, c, back
        if i % 2:
            # the frees reach node 1 before the next receive allocates: b's block is in the
            # cache then (held by it: no other allocation can have its address), and taken
            pg.synchronize(1)
    # cycles 0 and 1 may take two blocks; every later one reuses one of the cached blocks
    assert len(seen) <= 3, f"node 1 took {len(seen)} different blocks in 40 cycles: no reuse"
    z = R.zeros(2 * N, np.float32, node=1)  # from a block written 40 times
    assert float(np.abs(z).sum()) == 0.0


@check
def a_fetched_array_is_reused_once_its_transfer_is_done() -> None:
    # the transport holds a large send's buffer until the receiver has copied it, no longer
    fresh_start()
    a = R.send(pattern(4, 4 * N))
    pa = addr(a)
    assert np.array_equal(a.get(), pattern(4, 4 * N))
    del a
    gc.collect()
    assert cached() == 4 * MIB, "an array fetched with get() stayed held after the transfer"
    assert addr(R.empty(4 * N, np.float32)) == pa


@check
def the_limit_is_honoured() -> None:
    fresh_start()
    arrays = [R.full(N, float(k), np.float32) for k in range(LIMIT // MIB + 3)]
    # all made before any is freed (a free that overtook the queued constructors would let
    # each take the block of the one before: one block for all)
    assert R.memory_info()["arrays"] == len(arrays)
    del arrays
    gc.collect()
    assert cached() == LIMIT, (cached(), LIMIT)  # the oldest went back to the OS
    big = R.zeros(LIMIT // 4 + 1, np.float32)  # larger than the limit: never cached
    del big
    gc.collect()
    assert cached() == LIMIT
    R.empty_cache()
    assert cached() == 0
    assert R.memory_info()["arrays"] == 0


@check
def zero_disables_the_cache() -> None:
    assert LIMIT == 0
    for i in range(10):
        a = R.send(pattern(i, 2 * N), node=0)
        b = a.to(1)
        z = R.zeros(N, np.float32, node=1)
        assert R.run(owns_data, b).get() and R.run(owns_data, a).get(), "an array came from a disabled cache"
        assert np.array_equal(b.get(), pattern(i, 2 * N)) and not z.any().get()
        del a, b, z
        gc.collect()
        assert cached(0) == 0 and cached(1) == 0


checks.run(sys.argv[1:])
