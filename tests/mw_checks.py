"""Master-worker checks, run as a script by tests/test_master_worker.py (real processes).

Every rank runs this file; rank 0 returns from init_master_worker and runs the checks
named on the command line, printing one JSON line: {check: null | traceback}. The
functions that remote.run ships are defined before init_master_worker, so the workers
(which run the file up to that call) can unpickle them.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable

import numpy as np
import procgroup as pg
from _mw_run import Checks

_FLAG = threading.Event()


def wait_for_flag(seconds: float) -> bool:
    """On a worker: True once set_flag ran on another stream (False after ``seconds``)."""
    return _FLAG.wait(seconds)


def set_flag() -> bool:
    _FLAG.set()
    return True


def boom(x: np.ndarray) -> None:
    raise ValueError(f"boom on an array of shape {x.shape}")


def scale(x: np.ndarray, k: float) -> np.ndarray:
    return x * k


def worker_pid() -> int:
    return os.getpid()


def cap_memory(headroom: int) -> int | None:
    """On a worker: cap its address space at what it maps now plus ``headroom`` bytes, so
    that a larger allocation fails; returns the soft limit to restore (None: no /proc)."""
    import resource

    try:
        with open("/proc/self/status", encoding="ascii") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except OSError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, hard))
    return soft


def uncap_memory(soft: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))


def slow_fill(x: np.ndarray, value: float, flag_seconds: float) -> None:
    _FLAG.wait(flag_seconds)
    x[...] = value


BACKEND = os.environ.get("MW_BACKEND") or None
pg.init_master_worker(BACKEND)

# ---------------------------------------------------------------- only the master gets here
R = pg.remote
checks = Checks()
check = checks.register


def held() -> dict[str, int]:
    """What the current node holds for the master (memory_info less its cache)."""
    info = R.memory_info()
    return {"arrays": info["arrays"], "bytes": info["bytes"]}


def same(remote: R.RemoteArray, local: np.ndarray, what: str = "") -> None:
    got = remote.get()
    assert remote.shape == local.shape, (what, remote.shape, local.shape)
    assert remote.dtype == local.dtype, (what, remote.dtype, local.dtype)
    assert got.shape == local.shape and got.dtype == local.dtype, (what, got.shape, got.dtype)
    if local.dtype.kind == "f":
        np.testing.assert_allclose(got, local, rtol=1e-5, atol=1e-6, err_msg=what)
    else:
        np.testing.assert_array_equal(got, local, err_msg=what)


def raises_like(remote_call, local_call, what: str) -> None:
    """The remote call raises NumPy's exception: same type and same message."""
    try:
        local_call()
    except Exception as exc:  # noqa: BLE001 - compared with the remote call's
        expected = exc
    else:
        raise AssertionError(f"{what}: NumPy itself did not raise")
    try:
        remote_call()
    except Exception as exc:  # noqa: BLE001 - compared with the remote call's
        assert type(exc) is type(expected), (what, type(exc), type(expected), str(exc))
        assert str(exc) == str(expected), (what, str(exc), str(expected))
    else:
        raise AssertionError(f"{what}: the remote call did not raise {type(expected).__name__}")


@check
def issue_example() -> None:
    assert pg.num_nodes() == int(os.environ["MW_NODES"]) and pg.current_node() == 0
    x = R.full((20, 20), 4.0, dtype=np.float32)
    yl = np.random.rand(20, 20).astype(np.float32)
    y = R.send(yl)
    z = x + y
    assert (z.node, z.device, z.get_node(), z.get_device()) == (0, -1, 0, -1)
    assert (z.shape, z.dtype, z.ndim, z.size, z.nbytes) == ((20, 20), np.float32, 2, 400, 1600)
    np.testing.assert_allclose(np.asarray(z), 4 + yl)
    np.testing.assert_allclose(z.get(), 4 + yl)
    last = pg.num_nodes() - 1
    with pg.node(last):
        a = R.zeros(10, dtype=np.float32)
        assert pg.current_node() == last
    assert a.node == last and pg.current_node() == 0
    b = a.to(0)
    assert b.node == 0
    same(b, np.zeros(10, np.float32))
    pg.set_node(last)
    assert pg.current_node() == last and R.ones(3).node == last
    pg.set_node(0)


@check
def constructors() -> None:
    for n in range(pg.num_nodes()):
        e = R.empty((2, 3), node=n)  # garbage until written (NaN * 0 is NaN): filled first
        e.fill(0)
        same(e, np.zeros((2, 3)))
        same(R.zeros((2, 3), np.int16, node=n), np.zeros((2, 3), np.int16))
        same(R.ones(5, np.float32, node=n), np.ones(5, np.float32))
        same(R.full((2, 2), 7, node=n), np.full((2, 2), 7))
        same(R.full(3, 2.5, np.float32, node=n), np.full(3, 2.5, np.float32))
        same(R.arange(10, node=n), np.arange(10))
        same(R.arange(1, 11, 3, node=n), np.arange(1, 11, 3))
        same(R.arange(0.0, 1.0, 0.1, node=n), np.arange(0.0, 1.0, 0.1))
        same(R.arange(5, dtype=np.float32, node=n), np.arange(5, dtype=np.float32))
        base = R.arange(6, node=n).reshape(2, 3)
        for fn, local in ((R.zeros_like, np.zeros_like), (R.ones_like, np.ones_like)):
            out = fn(base)
            assert out.node == n
            same(out, local(np.arange(6).reshape(2, 3)))
        same(R.full_like(base, 9), np.full((2, 3), 9))
        e = R.empty_like(base, dtype=np.float32)
        e.fill(0)
        same(e, np.zeros((2, 3), np.float32))
        same(np.zeros_like(base), np.zeros((2, 3), np.int64))  # through __array_function__
        big = np.random.rand(300, 300)  # past the inline size: its own message
        same(R.send(big, node=n), big)
        same(R.send([[1, 2], [3, 4]], node=n), np.array([[1, 2], [3, 4]]))
        assert R.zeros(0, node=n).get().shape == (0,)
    raises_like(lambda: R.zeros(-1), lambda: np.zeros(-1), "negative dims")
    raises_like(lambda: R.zeros(3, dtype="nope"), lambda: np.zeros(3, dtype="nope"), "bad dtype")
    try:
        R.zeros(3, node=pg.num_nodes())
    except pg.InvalidArgumentError as exc:
        assert "does not exist" in str(exc)
    else:
        raise AssertionError("a node past the last one was accepted")


@check
def operators() -> None:
    al = np.arange(1, 13, dtype=np.float64).reshape(3, 4)
    bl = np.linspace(1, 2, 12).reshape(3, 4)
    il = np.arange(12, dtype=np.int32).reshape(3, 4)
    a, b, i = R.send(al), R.send(bl), R.send(il)
    for name, f in [("add", lambda p, q: p + q), ("sub", lambda p, q: p - q), ("mul", lambda p, q: p * q),
                    ("truediv", lambda p, q: p / q), ("floordiv", lambda p, q: p // q), ("mod", lambda p, q: p % q),
                    ("pow", lambda p, q: p ** q), ("lt", lambda p, q: p < q), ("le", lambda p, q: p <= q),
                    ("eq", lambda p, q: p == q), ("ne", lambda p, q: p != q), ("gt", lambda p, q: p > q),
                    ("ge", lambda p, q: p >= q)]:
        same(f(a, b), f(al, bl), name)
        same(f(a, 2), f(al, 2), name + " scalar")
        same(f(3, b), f(3, bl), name + " reflected")
        same(f(a, bl), f(al, bl), name + " local array")
        same(f(al, b), f(al, bl), name + " local array on the left")
    same(a @ b.T, al @ bl.T, "matmul")
    same(-a, -al, "neg")
    same(+a, +al, "pos")
    same(abs(-a), abs(-al), "abs")
    same(~i, ~il, "invert")
    same(i & 5, il & 5, "and")
    same(i | 5, il | 5, "or")
    same(i ^ 5, il ^ 5, "xor")
    same(i << 2, il << 2, "lshift")
    same(i >> 1, il >> 1, "rshift")
    same(a + i, al + il, "mixed dtypes")
    same(R.ones(3, np.float32) + 0.5, np.ones(3, np.float32) + 0.5, "weak scalar keeps float32")
    same(R.ones(3, np.uint8) + 1, np.ones(3, np.uint8) + 1, "uint8 + int")
    c, cl = a.copy(), al.copy()
    for op in ("+=", "-=", "*=", "/=", "**=", "//=", "%="):
        exec(f"c {op} b; cl {op} bl")
    same(c, cl, "in-place")
    k, kl = i.copy(), il.copy()
    k += 2
    kl += 2
    k <<= 1
    kl <<= 1
    k &= 7
    kl &= 7
    same(k, kl, "in-place ints")
    m = R.send(np.eye(4))
    m @= R.send(np.full((4, 4), 2.0))
    same(m, np.eye(4) @ np.full((4, 4), 2.0), "in-place matmul")
    q, r = divmod(a, 5)
    ql, rl = divmod(al, 5)
    same(q, ql, "divmod q")
    same(r, rl, "divmod r")


@check
def ufuncs_and_functions() -> None:
    al = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4)
    a = R.send(al)
    for f in (np.exp, np.log, np.sqrt, np.sin, np.square, np.negative, np.isfinite, np.floor):
        same(f(a), f(al), f.__name__)
    z = R.empty_like(a)
    res = np.add(a, a, out=z)
    assert res is z
    same(z, al + al, "out=")
    same(np.maximum(a, 10), np.maximum(al, 10), "maximum")
    same(np.add.reduce(a, axis=1), np.add.reduce(al, axis=1), "reduce")
    same(np.multiply.accumulate(a, axis=2), np.multiply.accumulate(al, axis=2), "accumulate")
    for name in ("sum", "mean", "max", "min", "prod", "std", "var", "any", "all", "argmax", "argmin"):
        f = getattr(np, name)
        same(f(a), np.asarray(f(al)), name)
        same(f(a, axis=1), f(al, axis=1), name + " axis=1")
        if name not in ("argmax", "argmin"):
            same(f(a, axis=(0, 2), keepdims=True), f(al, axis=(0, 2), keepdims=True), name + " keepdims")
    same(np.cumsum(a), np.cumsum(al), "cumsum")
    same(np.cumsum(a, axis=1), np.cumsum(al, axis=1), "cumsum axis")
    same(np.sum(a, dtype=np.float64), np.asarray(np.sum(al, dtype=np.float64)), "sum dtype")
    same(np.reshape(a, (4, 6)), al.reshape(4, 6), "reshape")
    same(np.transpose(a, (2, 0, 1)), np.transpose(al, (2, 0, 1)), "transpose")
    same(np.ravel(a), np.ravel(al), "ravel")
    same(np.squeeze(a[:1]), np.squeeze(al[:1]), "squeeze")
    same(np.expand_dims(a, 1), np.expand_dims(al, 1), "expand_dims")
    same(np.swapaxes(a, 0, 2), np.swapaxes(al, 0, 2), "swapaxes")
    same(np.concatenate([a, a], axis=2), np.concatenate([al, al], axis=2), "concatenate")
    same(np.concatenate([a, a], axis=None), np.concatenate([al, al], axis=None), "concatenate None")
    same(np.stack([a, a], axis=1), np.stack([al, al], axis=1), "stack")
    same(np.where(a > 10, a, 0.5), np.where(al > 10, al, 0.5), "where")
    same(np.clip(a, 3, 9), np.clip(al, 3, 9), "clip")
    m, ml = a[0], al[0]
    same(np.dot(m, m.T), np.dot(ml, ml.T), "dot 2d")
    same(np.dot(m, R.ones(4, np.float32)), np.dot(ml, np.ones(4, np.float32)), "dot 2d 1d")
    same(np.matmul(a, a.transpose(0, 2, 1)), np.matmul(al, al.transpose(0, 2, 1)), "batched matmul")
    same(np.outer(m[0], m[1]), np.outer(ml[0], ml[1]), "outer")
    same(np.round(a / 7, 2), np.round(al / 7, 2), "round")
    assert np.allclose(a, al) and np.array_equal(a, al) and not np.array_equal(a, al + 1)
    assert np.shape(a) == (2, 3, 4) and np.ndim(a) == 3 and np.size(a) == 24
    try:
        np.linalg.svd(a)
    except TypeError as exc:
        assert "not supported on RemoteArray" in str(exc) and "remote.run" in str(exc)
    else:
        raise AssertionError("an unsupported function did not raise")


@check
def methods() -> None:
    al = np.arange(12, dtype=np.float64).reshape(3, 4)
    a = R.send(al)
    same(a.sum(axis=0), al.sum(axis=0), "sum(axis)")
    same(a.sum(), np.asarray(al.sum()), "sum()")
    same(a.mean(axis=1, keepdims=True), al.mean(axis=1, keepdims=True), "mean")
    same(a.max(axis=0), al.max(axis=0), "max")
    same(a.reshape(4, 3), al.reshape(4, 3), "reshape")
    same(a.reshape((2, -1)), al.reshape((2, -1)), "reshape -1")
    same(a.T, al.T, "T")
    same(a.transpose(1, 0), al.transpose(1, 0), "transpose")
    same(a.astype(np.int8), al.astype(np.int8), "astype")
    assert a.astype(np.float64, copy=False) is a
    c = a.copy()
    c.fill(3)
    same(c, np.full((3, 4), 3.0), "fill")
    same(a, al, "copy left the original alone")
    same(a.flatten(), al.flatten(), "flatten")
    same(a.clip(2, 5), al.clip(2, 5), "clip")
    same(a.cumsum(axis=1), al.cumsum(axis=1), "cumsum")
    assert a.tolist() == al.tolist() and a.item if True else None
    assert len(a) == 3 and [r.shape for r in a] == [(4,)] * 3


@check
def indexing() -> None:
    al = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    a = R.send(al)
    for key in (1, (1, 2), (slice(None), 1), (Ellipsis, 2), (slice(0, 2), None, slice(1, None, 2)),
                (-1, slice(None, None, -1)), np.array([2, 0]), (np.array([0, 2]), slice(None), np.array([1, 3])),
                al[:, 0, 0] > 10, (1, 2, 3)):
        same(a[key], np.asarray(al[key]), f"getitem {key!r}")
    idx = R.send(np.array([2, 1, 2]))
    same(a[idx], al[np.array([2, 1, 2])], "remote int index")
    b, bl = a.copy(), al.copy()
    b[0] = 7
    bl[0] = 7
    b[1, :, 2:4] = R.full((4, 2), -1, np.float32)
    bl[1, :, 2:4] = np.full((4, 2), -1, np.float32)
    b[2, 1] = np.arange(5)
    bl[2, 1] = np.arange(5)
    b[..., 0] = b[..., 1]
    bl[..., 0] = bl[..., 1]
    same(b, bl, "slice assignment")
    v = a[0]  # a view, as in NumPy: writes through it reach a
    v += 100
    al2 = al.copy()
    al2[0] += 100
    same(a, al2, "views share memory as in NumPy")
    raises_like(lambda: a[3], lambda: al[3], "index out of bounds")
    raises_like(lambda: a[0, 0, 0, 0], lambda: al[0, 0, 0, 0], "too many indices")
    try:
        a[a > 3]
    except TypeError as exc:
        assert "data-dependent" in str(exc)
    else:
        raise AssertionError("a boolean RemoteArray index was accepted")


@check
def numpy_errors_at_the_call() -> None:
    gc.collect()
    gc.disable()  # a collection now would free earlier arrays and change the counts
    try:
        _numpy_errors()
    finally:
        gc.enable()


def _numpy_errors() -> None:
    before = held()
    empty = R.zeros(0)
    a, al = R.ones((2, 3)), np.ones((2, 3))
    b, bl = R.ones((4,)), np.ones((4,))
    t, tl = R.ones(3, np.bool_), np.ones(3, np.bool_)
    u, ul = R.ones(3, np.uint8), np.ones(3, np.uint8)
    after_setup = held()
    raises_like(lambda: a + b, lambda: al + bl, "broadcast")
    raises_like(lambda: a @ b, lambda: al @ bl, "matmul")
    raises_like(lambda: np.dot(a, b), lambda: np.dot(al, bl), "dot")
    raises_like(lambda: t - t, lambda: tl - tl, "boolean subtract")
    raises_like(lambda: u + 300, lambda: ul + 300, "python int out of range")
    raises_like(lambda: a.reshape(4, 2), lambda: al.reshape(4, 2), "reshape")
    raises_like(lambda: a.sum(axis=2), lambda: al.sum(axis=2), "axis")
    raises_like(lambda: np.concatenate([a, b]), lambda: np.concatenate([al, bl]), "concatenate")
    raises_like(lambda: np.add(a, 1, out=b), lambda: np.add(al, 1, out=bl), "out shape")
    raises_like(lambda: empty.max(), lambda: np.zeros(0).max(), "empty max")
    raises_like(lambda: a.astype("nope"), lambda: al.astype("nope"), "astype")

    def assign() -> None:
        a[0] = np.ones(4)

    def assign_local() -> None:
        al[0] = np.ones(4)

    raises_like(assign, assign_local, "setitem shape")
    raises_like(lambda: float(a), lambda: float(al), "float of a non-scalar")
    raises_like(lambda: bool(a), lambda: bool(al), "truth value of an array")
    assert held() == after_setup, "a refused call sent something"
    assert after_setup["arrays"] == before["arrays"] + 5, (before, after_setup)
    if pg.num_nodes() > 1:
        with pg.node(1):
            other = R.ones((2, 3))
        try:
            a + other
        except pg.InvalidArgumentError as exc:
            assert "node 0" in str(exc) and "node 1" in str(exc), str(exc)
        else:
            raise AssertionError("operands on two nodes were accepted")


@check
def sync_points() -> None:
    x = R.full((), 2.5)
    assert float(x) == 2.5 and int(x) == 2 and bool(x) and complex(x) == 2.5
    assert int(R.arange(10).sum()) == 45
    assert bool((R.arange(3) < 5).all())
    assert np.asarray(R.arange(3)).tolist() == [0, 1, 2]
    assert R.arange(3).get().tolist() == [0, 1, 2]
    w = R.zeros(8, np.float32)
    for _ in range(10_000):
        w += 1
    pg.synchronize()
    assert (w.get() == 10_000).all()  # one stream runs in order: the exact result
    for n in range(pg.num_nodes()):
        pg.synchronize(n)


@check
def remote_errors() -> None:
    x = R.ones((4, 4))
    try:
        R.run(boom, x)
    except pg.RemoteError as exc:
        assert exc.node == 0 and exc.rank == 1 and "boom" in exc.op and exc.exc_type == "ValueError", vars(exc)
        assert "boom on an array of shape (4, 4)" in str(exc)
        assert "Traceback" in exc.remote_traceback and "in boom" in exc.remote_traceback
    else:
        raise AssertionError("run of a raising function did not raise")
    bad = R.empty(1 << 44, np.uint8)  # 16 TiB: the worker's allocation fails
    derived = bad[:10] + 1  # issued without waiting: the error comes at the sync point
    try:
        derived.get()
    except pg.RemoteError as exc:
        assert exc.exc_type in ("MemoryError", "ValueError") and exc.op == "empty", (exc.op, exc.exc_type)
        assert "node 0" in str(exc)
    else:
        raise AssertionError("an array produced by a failed operation did not raise")
    try:
        bad.get()
    except pg.RemoteError:
        pass
    else:
        raise AssertionError("the failed array itself did not raise")
    pg.synchronize()  # already reported: nothing left to raise
    v = R.run_async(boom, x)
    try:
        pg.synchronize()
    except pg.RemoteError as exc:
        assert "boom" in exc.op
    else:
        raise AssertionError("synchronize did not raise the failure of run_async")
    try:
        v.get()
    except pg.RemoteError:
        pass
    else:
        raise AssertionError("RemoteValue.get of a failed run did not raise")
    same(x + 1, np.full((4, 4), 2.0), "the node stays usable")
    r = R.run(scale, x, 3.0)
    assert isinstance(r, R.RemoteArray) and r.node == 0
    same(r, np.full((4, 4), 3.0), "run returning an array")
    pid = R.run(worker_pid)
    assert isinstance(pid, R.RemoteValue) and pid.get() != os.getpid()
    try:
        R.run(lambda: 1)
    except TypeError as exc:
        assert "pickled" in str(exc)
    else:
        raise AssertionError("a lambda was accepted by remote.run")


@check
def gc_frees_remote_memory() -> None:
    gc.collect()
    gc.disable()  # only the collections this check asks for
    try:
        _gc_frees()
    finally:
        gc.enable()


def _gc_frees() -> None:
    base = held()
    arrays = [R.zeros(1 << 17) for _ in range(8)]  # 8 x 1 MiB
    grown = held()
    assert grown["arrays"] == base["arrays"] + 8, (base, grown)
    assert grown["bytes"] >= base["bytes"] + 8 * (1 << 20), (base, grown)
    del arrays
    gc.collect()
    back = R.memory_info()
    assert {"arrays": back["arrays"], "bytes": back["bytes"]} == base, (base, back)
    # their blocks stay in the worker's cache (default limit 512 MiB) until empty_cache
    assert back["cached_bytes"] >= 8 * (1 << 20), back
    R.empty_cache()
    assert R.memory_info()["cached_bytes"] == 0
    for _ in range(200):  # temporaries die as they go
        _ = (R.ones(1000) + 1).sum()
    del _
    gc.collect()
    assert held() == base


@check
def streams_and_events() -> None:
    s1, s2 = pg.Stream(), pg.Stream()
    assert s1 != s2 and s1.node == 0
    # overlap: the function on s1 returns True only if s2's function ran meanwhile
    waiting = None
    with s1:
        waiting = R.run_async(wait_for_flag, 20.0)
    with s2:
        R.run_async(set_flag)
    assert waiting.get() is True, "two streams of one node did not overlap"
    # order across streams through an event: s1 writes in place, the default stream waits
    y = R.zeros(1000)
    with s1:
        for _ in range(200):
            y += 1
        ev = pg.Event()
        ev.record()
    ev.wait()  # the current (default) stream of node 0 waits; the master does not
    z = y.copy()
    same(z, np.full(1000, 200.0), "event ordering")
    ev.synchronize()
    assert ev.query() and s1.query()
    start, end = pg.Event(enable_timing=True), pg.Event(enable_timing=True)
    start.record(s2)
    with s2:
        q = R.ones((200, 200)) @ R.ones((200, 200))
    end.record(s2)
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    s2.synchronize()
    same(q, np.full((200, 200), 200.0), "stream result")
    s1.wait_stream(s2)
    with s1:
        assert pg.remote.current_stream() == s1
    assert pg.remote.current_stream() == pg.remote.default_stream()
    unrecorded = pg.Event()
    assert unrecorded.query()
    unrecorded.synchronize()
    try:
        pg.Event().elapsed_time(start)
    except pg.ProcGroupError:
        pass
    else:
        raise AssertionError("elapsed_time of unrecorded events did not raise")


@check
def to_between_nodes() -> None:
    if pg.num_nodes() < 2:
        return
    al = np.random.rand(64, 33)
    a = R.send(al, node=0)
    b = a.to(1)
    assert (b.node, b.device) == (1, -1) and a.to(0) is a
    same(b, al, "to(1)")
    c = (b * 2).to(0)
    same(c, al * 2, "back to node 0")
    big = R.arange(1 << 21, dtype=np.float64, node=1)  # 16 MiB, worker to worker
    same(big.to(0)[-3:], np.arange(1 << 21, dtype=np.float64)[-3:], "big to()")
    # large enough for the READY rendezvous (get and to), and every byte checked
    whole = np.arange(1 << 19, dtype=np.float32) * 3 + 1
    on_1 = R.send(whole, node=1)
    same(on_1.to(0), whole, "2 MiB to() after READY")
    same(on_1, whole, "2 MiB get after READY")
    assert (on_1 + 1).get().tolist()[-2:] == (whole[-2:] + 1).tolist()
    failed = R.empty(1 << 44, np.uint8, node=1)
    moved = failed.to(0)  # the failure travels with the copy
    try:
        moved.get()
    except pg.RemoteError as exc:
        assert exc.node == 1, vars(exc)
    else:
        raise AssertionError("moving a failed array did not raise")
    same(R.ones(3, node=1).to(0), np.ones(3), "both nodes still usable")


def fails_on(action: Callable[[], object], node: int, what: str, **expect: str) -> None:
    """``action()`` raises the RemoteError of ``node``, with the fields in ``expect``."""
    try:
        action()
    except pg.RemoteError as exc:
        assert exc.node == node and all(getattr(exc, k) == v for k, v in expect.items()), (what, vars(exc))
    else:
        raise AssertionError(f"{what} did not raise")


@check
def copy_failures() -> None:
    """A copy whose source failed, or whose receiver cannot allocate (a ``.to()``, a
    ``remote.send``), fails that one array (naming the node at fault) and leaves both nodes
    usable: the sender never waits for a receive that will not come, nor the receiver for
    data that will not."""
    if pg.num_nodes() < 2:
        return
    size = (3 << 20) + 5  # past the frame and the READY threshold: posted where receives cancel
    bad = R.empty(1 << 44, np.uint8, node=0)[:size]  # fails on node 0; node 1 can hold its size
    fails_on(bad.to(1).get, 0, "moving a failed 3 MiB array", op="empty")
    same(R.full(4, 2.0, node=0).to(1), np.full(4, 2.0), "both nodes usable after a failed source")
    fails_on(lambda: pg.synchronize(0), 0, "node 0's own failure, not reported there yet", op="empty")
    source = R.full(64 << 20, 7, np.uint8, node=0)
    pg.synchronize(0)
    soft = R.run(cap_memory, 16 << 20, node=1).get()
    if soft is None:
        return
    try:
        refused = source.to(1)  # node 1 cannot allocate 64 MiB now
        fails_on(lambda: pg.synchronize(1), 1, "a copy to a node out of memory", exc_type="MemoryError")
        unsent = R.send(np.ones(64 << 20, np.uint8), node=1)  # returns: the node said NOT_READY
        fails_on(lambda: pg.synchronize(1), 1, "a remote.send to a node out of memory", exc_type="MemoryError",
                 op="put")
    finally:
        R.run(uncap_memory, soft, node=1).get()
    fails_on(unsent.get, 1, "the array a failed remote.send produced", exc_type="MemoryError")
    fails_on(refused.get, 1, "the array a failed copy produced", exc_type="MemoryError")
    source += 1  # the sender's stream went on: it did not wait for data to be taken
    assert int(source[-1]) == 8
    same(source[:5].to(1), np.full(5, 8, np.uint8), "both nodes usable after a refused copy")


@check
def across_nodes() -> None:
    n = pg.num_nodes()
    if n < 2:
        return
    arrays = [R.full((5, 3), float(k + 1), node=k) for k in range(n)]
    R.all_reduce(arrays)
    total = sum(range(1, n + 1))
    for a in arrays:
        same(a, np.full((5, 3), float(total)), "all_reduce sum")
    R.all_reduce(arrays, op=pg.ReduceOp.MAX)
    views = [R.arange(12.0, node=k).reshape(3, 4).T for k in range(n)]  # not contiguous
    R.all_reduce(views)
    same(views[0], n * np.arange(12.0).reshape(3, 4).T, "all_reduce of a view")
    src = [R.full(4, float(k), node=k) for k in range(n)]
    R.broadcast(src, n - 1)
    for a in src:
        same(a, np.full(4, float(n - 1)), "broadcast")
    if n >= 3:  # a subset of the nodes: a group of their own
        pair = [R.ones(2, node=0), R.ones(2, node=2)]
        R.all_reduce(pair)
        same(pair[1], np.full(2, 2.0), "subset all_reduce")
    for bad, why in (([arrays[0], arrays[0]], "same node"), ([arrays[0], R.ones(2, node=1)], "same shape")):
        try:
            R.all_reduce(bad)
        except pg.InvalidArgumentError as exc:
            assert why in str(exc), str(exc)
        else:
            raise AssertionError(f"all_reduce accepted arrays that are not {why}")


@check
def cuda() -> None:
    gpus = pg.remote._master.master().links[0].info["gpus"]
    x = R.ones(4)
    if not gpus:
        for call in (lambda: x.cuda(), lambda: R.zeros(3, device=0)):
            try:
                call()
            except pg.ProcGroupError as exc:
                assert "no CUDA GPU" in str(exc) and "node 0" in str(exc), str(exc)
            else:
                raise AssertionError("a GPU array was made on a node without a GPU")
        return
    c = x.cuda()
    assert (c.node, c.device) == (0, 0)
    same(c * 2 + 1, np.full(4, 3.0), "cuda ops")
    same((c + 1).cpu(), np.full(4, 2.0), "cpu()")
    same(np.exp(c).sum(), np.asarray(np.exp(np.ones(4)).sum()), "cuda ufunc + reduction")


checks.run(sys.argv[1:])
if os.environ.get("MW_DESTROY") == "1":
    pg.destroy_process_group()
