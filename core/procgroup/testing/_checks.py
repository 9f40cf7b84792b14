"""The checks of the conformance suite; each runs inside every rank of a live job.

Expected values are computed independently on every rank from the same deterministic
inputs (each rank can rebuild every other rank's data), never hard-coded. A check
raises AssertionError (or the op's own error) on failure.
"""

from __future__ import annotations

import array as pyarray
import os
from typing import Any
from collections.abc import Callable

import numpy as np

import procgroup as pg
from procgroup import errors
from procgroup.backend import Work
from procgroup.ops import ReduceOp, check_op_dtype

from ._fake_gpu import FakeGpuArray

CHECKS: dict[str, Callable[[int, int, dict[str, Any]], None]] = {}

DTYPES = ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "bool", "complex64", "complex128"]
SIZES = [0, 1, 1001]
BIG_ELEMS = 4 * 1024 * 1024  # 16 MiB of float32


def check(fn: Callable[[int, int, dict[str, Any]], None]) -> Callable[[int, int, dict[str, Any]], None]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def data(rank: int, count: int, dtype: str, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: small values so sums and products stay exact in any dtype."""
    rng = np.random.default_rng([salt, rank, count])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    vals = rng.integers(1, 3, count)  # 1 or 2: products of 4 ranks stay small
    if dt.kind == "c":
        return (vals + 1j * rng.integers(0, 2, count)).astype(dt)
    return vals.astype(dt)


def expected_reduce(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    dt = inputs[0].dtype
    acc = inputs[0].copy()
    for other in inputs[1:]:
        fn: Callable[[Any, Any], Any]  # a NumPy ufunc: logical ones give bool, the others dt
        if dt.kind == "b":
            fn = {ReduceOp.SUM: np.logical_or, ReduceOp.PRODUCT: np.logical_and, ReduceOp.MIN: np.logical_and,
                  ReduceOp.MAX: np.logical_or, ReduceOp.BAND: np.logical_and, ReduceOp.BOR: np.logical_or,
                  ReduceOp.BXOR: np.logical_xor}[op]
        else:
            fn = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
                  ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
                  ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}[op]
        acc = fn(acc, other).astype(dt)
    if op is ReduceOp.AVG:
        acc = (acc / len(inputs)).astype(dt)
    return acc


def valid_ops(dtype: str) -> list[ReduceOp]:
    ops = []
    for op in ReduceOp:
        try:
            check_op_dtype(op, dtype)
            ops.append(op)
        except errors.UnsupportedOperationError:
            pass
    return ops


def assert_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if want.dtype.kind in "fc" and want.dtype.itemsize <= 4:
        ok = np.allclose(got, want, rtol=1e-2)
    elif want.dtype.kind in "fc":
        ok = np.allclose(got, want)
    else:
        ok = np.array_equal(got, want)
    if not ok:
        bad = np.flatnonzero(np.asarray(got != want).reshape(-1))[:5]
        raise AssertionError(f"{what}: mismatch at {bad.tolist()}: got {got.reshape(-1)[bad]}, want {want.reshape(-1)[bad]}")


def raises(exc_type: type[BaseException], fn: Callable[[], Any], needle: str = "") -> None:
    try:
        fn()
    except exc_type as exc:
        if needle and needle not in str(exc):
            raise AssertionError(f"{exc_type.__name__} raised but message lacks {needle!r}: {exc}") from exc
        return
    raise AssertionError(f"expected {exc_type.__name__} ({needle!r}) but nothing was raised")


def started(work: Work | None) -> Work:
    """The Work of an async op or isend/irecv this rank is a member of (the ops return
    None only to a rank outside the group)."""
    if work is None:
        raise AssertionError("a member's async op returned no Work")
    return work


# ------------------------------------------------------------------------ point to point
@check
def check_send_recv(rank: int, size: int, opts: dict[str, Any]) -> None:
    if size == 1:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    for dtype in DTYPES:
        for count in SIZES + [BIG_ELEMS // 8]:
            out = data(rank, count, dtype, salt=1)
            into = np.zeros(count, dtype=dtype)
            work = started(pg.isend(out, right))
            sender = pg.recv(into, left)
            work.wait()
            assert sender == left, (sender, left)
            assert_equal(into, data(left, count, dtype, salt=1), f"send/recv {dtype}[{count}]")


@check
def check_ordering_and_tags(rank: int, size: int, opts: dict[str, Any]) -> None:
    if size == 1:
        return
    if rank == 0:
        for i in range(5):
            pg.send(np.full(3, i, dtype=np.int64), 1, tag=7)
        pg.send(np.full(2, 100, dtype=np.int64), 1, tag=8)
    elif rank == 1:
        late = np.zeros(2, dtype=np.int64)
        pg.recv(late, 0, tag=8)  # tag 8 was sent last but is matched first
        assert (late == 100).all()
        for i in range(5):
            buf = np.zeros(3, dtype=np.int64)
            pg.recv(buf, 0, tag=7)
            assert (buf == i).all(), f"message {i} overtaken: got {buf}"


@check
def check_any_source(rank: int, size: int, opts: dict[str, Any]) -> None:
    if size == 1:
        return
    if rank == 0:
        seen = []
        for _ in range(size - 1):
            buf = np.zeros(4, dtype=np.float64)
            src = pg.recv(buf, tag=3)
            assert (buf == src).all(), (src, buf)
            seen.append(src)
        assert sorted(seen) == list(range(1, size)), seen
        work = started(pg.irecv(np.zeros(1), tag=4))
        work.wait()
        assert work.source_rank() == size - 1
    else:
        pg.send(np.full(4, rank, dtype=np.float64), 0, tag=3)
        if rank == size - 1:
            pg.send(np.ones(1), 0, tag=4)


@check
def check_async_p2p(rank: int, size: int, opts: dict[str, Any]) -> None:
    if size == 1:
        return
    peer = rank ^ 1
    if peer >= size:
        return
    sends = [started(pg.isend(np.full(1000 * (i + 1), rank * 10 + i, dtype=np.int32), peer, tag=i)) for i in range(4)]
    bufs = [np.zeros(1000 * (i + 1), dtype=np.int32) for i in range(4)]
    recvs = [started(pg.irecv(bufs[i], peer, tag=i)) for i in reversed(range(4))]
    for w in recvs + sends:
        w.wait()
        assert w.is_completed()
    for i in range(4):
        assert (bufs[i] == peer * 10 + i).all()


@check
def check_recv_timeout(rank: int, size: int, opts: dict[str, Any]) -> None:
    if size == 1:
        return
    work = started(pg.irecv(np.zeros(1), (rank + 1) % size, tag=99))
    raises(errors.CommTimeoutError, lambda: work.wait(timeout=0.3))


@check
def check_wait_timeout_keeps_the_receive(rank: int, size: int, opts: dict[str, Any]) -> None:
    """Work.wait(timeout) that expires leaves the receive posted; a later wait gets it."""
    if size == 1:
        return
    if rank == 0:
        buf = np.zeros(3, dtype=np.int64)
        work = started(pg.irecv(buf, 1, tag=41))
        raises(errors.CommTimeoutError, lambda: work.wait(timeout=0.2))
        pg.send(np.ones(1), 1, tag=42)  # now rank 1 sends
        work.wait()
        assert (buf == 5).all() and work.source_rank() == 1
    elif rank == 1:
        pg.recv(np.zeros(1), 0, tag=42)
        pg.send(np.full(3, 5, dtype=np.int64), 0, tag=41)


@check
def check_cancel_recv(rank: int, size: int, opts: dict[str, Any]) -> None:
    """Work.cancel(): a receive no message matched is withdrawn (always, where the backend
    says it can: ``DataChannel.cancels_recv``) and takes nothing; the message with its tag
    goes to the next receive; a receive that completed is not cancelled."""
    if size == 1:
        return
    if rank == 0:
        first = np.zeros(4, dtype=np.int32)
        work = started(pg.irecv(first, 1, tag=51))
        withdrawn = work.cancel()
        if pg.group_channel().cancels_recv:
            assert withdrawn, "the backend says it cancels receives, but cancel() returned False"
        if withdrawn:
            assert work.is_completed()
            raises(errors.WorkCancelledError, work.wait)
            assert work.cancel(), "a second cancel() of a withdrawn receive still answers True"
        pg.send(np.ones(1), 1, tag=52)  # now rank 1 sends the message of tag 51
        second = np.zeros(4, dtype=np.int32)
        if withdrawn:
            assert pg.recv(second, 1, tag=51) == 1
            assert (first == 0).all(), "a withdrawn receive took data"
        else:  # it stays posted and takes the message
            work.wait()
            second = first
        assert (second == 7).all()
        third = np.zeros(2, dtype=np.float64)
        done = started(pg.irecv(third, 1, tag=53))
        done.wait()
        assert not done.cancel(), "cancel() of a completed receive returned True"
        assert (third == 9).all() and done.source_rank() == 1
    elif rank == 1:
        pg.recv(np.zeros(1), 0, tag=52)
        pg.send(np.full(4, 7, dtype=np.int32), 0, tag=51)
        pg.send(np.full(2, 9, dtype=np.float64), 0, tag=53)


@check
def check_group_point_to_point(rank: int, size: int, opts: dict[str, Any]) -> None:
    """p2p on a group: world ranks in, world ranks out, and only members are heard."""
    if size < 3:
        return
    g = pg.new_group([1, 2])
    if rank == 0:  # a non-member sends on the world with the tag the group listens on
        pg.send(np.full(2, -1.0), 1, tag=9)
    elif rank == 2:
        pg.send(np.full(2, 2.0), 1, group=g, tag=9)
    elif rank == 1:
        buf = np.zeros(2)
        work = started(pg.irecv(buf, group=g, tag=9))
        work.wait()
        assert work.source_rank() == 2 and (buf == 2.0).all(), (work.source_rank(), buf)
        assert pg.recv(buf, 0, tag=9) == 0 and (buf == -1.0).all()
    if rank in (1, 2):
        peer = 3 - rank
        w = started(pg.irecv(np.zeros(1), peer, group=g, tag=3))
        pg.send(np.zeros(1), peer, group=g, tag=3)
        w.wait()
        assert w.source_rank() == peer


@check
def check_buffer_protocol(rank: int, size: int, opts: dict[str, Any]) -> None:
    arr = pyarray.array("d", [float(rank)] * 5)
    pg.all_reduce(arr)
    assert list(arr) == [float(sum(range(size)))] * 5
    raw = bytearray([rank + 1] * 3)
    pg.all_reduce(raw, op=ReduceOp.MAX)
    assert list(raw) == [size] * 3


# ------------------------------------------------------------------------ collectives
@check
def check_all_reduce(rank: int, size: int, opts: dict[str, Any]) -> None:
    for dtype in DTYPES:
        for op in valid_ops(dtype):
            for count in SIZES:
                arr = data(rank, count, dtype, salt=list(ReduceOp).index(op))
                pg.all_reduce(arr, op=op)
                want = expected_reduce([data(r, count, dtype, salt=list(ReduceOp).index(op)) for r in range(size)], op)
                assert_equal(arr, want, f"all_reduce {op.name} {dtype}[{count}]")


@check
def check_all_reduce_large(rank: int, size: int, opts: dict[str, Any]) -> None:
    for count in (70_001, BIG_ELEMS):
        arr = data(rank, count, "float32", salt=5)
        pg.all_reduce(arr)
        want = expected_reduce([data(r, count, "float32", salt=5) for r in range(size)], ReduceOp.SUM)
        assert_equal(arr, want, f"all_reduce SUM float32[{count}]")
    shaped = np.full((3, 5, 7), rank + 1, dtype=np.float64)
    pg.all_reduce(shaped, op=ReduceOp.AVG)
    assert np.allclose(shaped, (size + 1) / 2)


@check
def check_beyond_16mib(rank: int, size: int, opts: dict[str, Any]) -> None:
    """Arrays just over 16 MiB: transports that work in pieces must stitch them right."""
    count = BIG_ELEMS + 5
    arr = data(rank, count, "float32", salt=11)
    pg.all_reduce(arr, op=ReduceOp.MAX)
    assert_equal(arr, expected_reduce([data(r, count, "float32", salt=11) for r in range(size)], ReduceOp.MAX),
                 "all_reduce MAX beyond 16 MiB")
    arr = data(rank, count, "float32", salt=12)
    pg.broadcast(arr, size - 1)
    assert_equal(arr, data(size - 1, count, "float32", salt=12), "broadcast beyond 16 MiB")
    arr = data(rank, count, "float32", salt=13)
    pg.reduce(arr, 0)
    want = expected_reduce([data(r, count, "float32", salt=13) for r in range(size)], ReduceOp.SUM)
    assert_equal(arr, want if rank == 0 else data(rank, count, "float32", salt=13), "reduce beyond 16 MiB")
    outs = [np.empty(count, dtype=np.float32) for _ in range(size)]
    pg.all_gather(outs, data(rank, count, "float32", salt=14))
    for r in range(size):
        assert_equal(outs[r], data(r, count, "float32", salt=14), f"all_gather beyond 16 MiB, slot {r}")
    per = (BIG_ELEMS + 5) // max(size, 1) + 3
    ins = [data(rank * size + j, per, "float32", salt=15) for j in range(size)]
    out = np.empty(per, dtype=np.float32)
    pg.reduce_scatter(out, ins)
    want = expected_reduce([data(r * size + rank, per, "float32", salt=15) for r in range(size)], ReduceOp.SUM)
    assert_equal(out, want, "reduce_scatter beyond 16 MiB in total")
    sent = [data(rank * size + j, per, "float32", salt=16) for j in range(size)]
    got = [np.empty(per, dtype=np.float32) for _ in range(size)]
    pg.all_to_all(got, sent)
    for j in range(size):
        assert_equal(got[j], data(j * size + rank, per, "float32", salt=16), f"all_to_all beyond 16 MiB, from {j}")


@check
def check_broadcast(rank: int, size: int, opts: dict[str, Any]) -> None:
    for root in range(size):
        for dtype in ("float32", "int64", "bool", "complex64", "float16"):
            for count in SIZES + [BIG_ELEMS // 4]:
                arr = data(rank, count, dtype, salt=2 + root)
                pg.broadcast(arr, root)
                assert_equal(arr, data(root, count, dtype, salt=2 + root), f"broadcast from {root} {dtype}[{count}]")


@check
def check_reduce(rank: int, size: int, opts: dict[str, Any]) -> None:
    for root in range(size):
        for dtype, op in (("float64", ReduceOp.SUM), ("int32", ReduceOp.MAX), ("uint8", ReduceOp.BXOR),
                          ("float32", ReduceOp.AVG), ("int64", ReduceOp.PRODUCT)):
            for count in SIZES + [70_001]:
                mine = data(rank, count, dtype, salt=3)
                arr = mine.copy()
                pg.reduce(arr, root, op=op)
                if rank == root:
                    want = expected_reduce([data(r, count, dtype, salt=3) for r in range(size)], op)
                    assert_equal(arr, want, f"reduce {op.name} to {root} {dtype}[{count}]")
                else:
                    assert_equal(arr, mine, f"reduce left a non-root array changed ({op.name})")


@check
def check_all_gather(rank: int, size: int, opts: dict[str, Any]) -> None:
    for dtype in ("float32", "int16", "bool"):
        for count in SIZES + [70_001]:
            outs = [np.zeros(count, dtype=dtype) for _ in range(size)]
            pg.all_gather(outs, data(rank, count, dtype, salt=4))
            for r in range(size):
                assert_equal(outs[r], data(r, count, dtype, salt=4), f"all_gather slot {r} {dtype}[{count}]")


@check
def check_gather_scatter(rank: int, size: int, opts: dict[str, Any]) -> None:
    for root in range(size):
        for count in (0, 1, 1001):
            mine = data(rank, count, "float64", salt=6)
            glist = [np.zeros(count) for _ in range(size)] if rank == root else None
            pg.gather(mine, glist, dst=root)
            if glist is not None:  # the root's
                for r in range(size):
                    assert_equal(glist[r], data(r, count, "float64", salt=6), f"gather to {root} slot {r}")
            out = np.zeros(count, dtype=np.int32)
            slist = [data(root * 100 + r, count, "int32", salt=7) for r in range(size)] if rank == root else None
            pg.scatter(out, slist, src=root)
            assert_equal(out, data(root * 100 + rank, count, "int32", salt=7), f"scatter from {root}")


@check
def check_reduce_scatter(rank: int, size: int, opts: dict[str, Any]) -> None:
    for dtype, op in (("float32", ReduceOp.SUM), ("int64", ReduceOp.MIN), ("float64", ReduceOp.AVG)):
        for count in (0, 1, 1001):
            ins = [data(rank * size + j, count, dtype, salt=8) for j in range(size)]
            keep = [i.copy() for i in ins]
            out = np.zeros(count, dtype=dtype)
            pg.reduce_scatter(out, ins, op=op)
            want = expected_reduce([data(r * size + rank, count, dtype, salt=8) for r in range(size)], op)
            assert_equal(out, want, f"reduce_scatter {op.name} {dtype}[{count}]")
            for a, b in zip(ins, keep):
                assert_equal(a, b, "reduce_scatter changed its input_list")


@check
def check_all_to_all(rank: int, size: int, opts: dict[str, Any]) -> None:
    for count in (0, 1, 1001):
        ins = [data(rank * 100 + j, count, "int32", salt=9) for j in range(size)]
        outs = [np.zeros(count, dtype=np.int32) for _ in range(size)]
        pg.all_to_all(outs, ins)
        for j in range(size):
            assert_equal(outs[j], data(j * 100 + rank, count, "int32", salt=9), f"all_to_all from {j}")


@check
def check_barrier(rank: int, size: int, opts: dict[str, Any]) -> None:
    folder = opts["tmpdir"]
    for round_ in range(3):
        with open(os.path.join(folder, f"barrier-{round_}-{rank}"), "w") as f:
            f.write("x")
        pg.barrier()
        present = [os.path.exists(os.path.join(folder, f"barrier-{round_}-{r}")) for r in range(size)]
        assert all(present), f"barrier round {round_} returned before ranks {[r for r, p in enumerate(present) if not p]} arrived"
        pg.barrier()


@check
def check_async_collectives(rank: int, size: int, opts: dict[str, Any]) -> None:
    a = np.full(1000, rank + 1, dtype=np.float64)
    b = np.full(70_001, rank, dtype=np.int64)
    c = np.full(7, rank, dtype=np.float32)
    outs = [np.zeros(3, dtype=np.int32) for _ in range(size)]
    works = [
        started(pg.all_reduce(a, async_op=True)),
        started(pg.all_reduce(b, op=ReduceOp.MAX, async_op=True)),
        started(pg.broadcast(c, 0, async_op=True)),
        started(pg.all_gather(outs, np.full(3, rank, dtype=np.int32), async_op=True)),
        started(pg.barrier(async_op=True)),
    ]
    for w in works:
        assert w is not None
        w.wait()
        assert w.is_completed()
    assert (a == size * (size + 1) / 2).all() and (b == size - 1).all() and (c == 0).all()
    assert [int(o[0]) for o in outs] == list(range(size))
    # a blocking collective after async ones keeps the order on every rank
    d = np.ones(3)
    w = started(pg.all_reduce(np.ones(3), async_op=True))
    pg.all_reduce(d)
    w.wait()
    assert (d == size).all()
    red = np.full(5, rank, dtype=np.int32)
    started(pg.reduce(red, 0, async_op=True)).wait()
    rs = np.zeros(2)
    started(pg.reduce_scatter(rs, [np.ones(2) for _ in range(size)], async_op=True)).wait()
    assert (rs == size).all()


@check
def check_groups(rank: int, size: int, opts: dict[str, Any]) -> None:
    evens = list(range(0, size, 2))
    g = pg.new_group(evens)
    whole = pg.new_group()
    assert pg.get_world_size(g) == len(evens)
    if rank in evens:
        assert pg.get_rank(g) == evens.index(rank)
        arr = np.full(9, rank, dtype=np.int64)
        pg.all_reduce(arr, group=g)
        assert (arr == sum(evens)).all()
        b = np.full(3, rank, dtype=np.float32)
        pg.broadcast(b, evens[-1], group=g)
        assert (b == evens[-1]).all()
        outs = [np.zeros(2, dtype=np.int32) for _ in evens]
        pg.all_gather(outs, np.full(2, rank, dtype=np.int32), group=g)
        assert [int(o[0]) for o in outs] == evens
        pg.barrier(group=g)
        if size > 1:
            raises(errors.InvalidArgumentError, lambda: pg.broadcast(b, 1, group=g), "not a rank of this group")
    else:
        assert pg.get_rank(g) == -1
        import warnings

        with warnings.catch_warnings(record=True):  # torch's rule: a non-member warns, nothing happens
            warnings.simplefilter("always")
            untouched = np.zeros(1)
            assert pg.all_reduce(untouched, group=g) is None and untouched[0] == 0
    arr = np.full(4, 1.0)
    pg.all_reduce(arr, group=whole)
    assert (arr == size).all()
    pg.barrier()


@check
def check_side_group(rank: int, size: int, opts: dict[str, Any]) -> None:
    from procgroup.plugins import backends

    if "tcp" not in backends() or opts["backend"] == "tcp":
        return
    side = pg.new_group(backend="tcp")
    arr = np.full(5, rank, dtype=np.int32)
    pg.all_reduce(arr, group=side)
    assert (arr == sum(range(size))).all()
    assert pg.get_backend(side) == "tcp"


@check
def check_object_collectives(rank: int, size: int, opts: dict[str, Any]) -> None:
    objs: list[Any] = [None] * size
    pg.all_gather_object(objs, {"rank": rank, "tag": "x" * rank})
    assert objs == [{"rank": r, "tag": "x" * r} for r in range(size)]
    gathered: list[Any] | None = [None] * size if rank == 0 else None
    pg.gather_object(("r", rank), gathered, dst=0)
    if rank == 0:
        assert gathered == [("r", r) for r in range(size)]
    blist: list[Any] = [rank, "mine", None] if rank == size - 1 else [None, None, None]
    pg.broadcast_object_list(blist, src=size - 1)
    assert blist == [size - 1, "mine", None]
    out: list[Any] = [None]
    pg.scatter_object_list(out, [{"to": r} for r in range(size)] if rank == 0 else None, src=0)
    assert out[0] == {"to": rank}


@check
def check_fake_gpu_arrays(rank: int, size: int, opts: dict[str, Any]) -> None:
    if "cuda" in opts.get("devices", ()):
        return  # a CUDA backend would get the fake pointer as real device memory
    arr = FakeGpuArray(np.full(11, rank + 1, dtype=np.float32))
    pg.all_reduce(arr)
    assert (arr.host == size * (size + 1) / 2).all()
    b = FakeGpuArray(np.full(4, rank, dtype=np.int64))
    pg.broadcast(b, size - 1)
    assert (b.host == size - 1).all()
    outs = [FakeGpuArray.zeros(3, np.int32) for _ in range(size)]
    pg.all_gather(outs, FakeGpuArray(np.full(3, rank, dtype=np.int32)))
    assert [int(o.host[0]) for o in outs] == list(range(size))
    if size > 1:
        into = FakeGpuArray.zeros(6, np.float64)
        w = started(pg.isend(FakeGpuArray(np.full(6, rank, dtype=np.float64)), (rank + 1) % size))
        pg.recv(into, (rank - 1) % size)
        w.wait()
        assert (into.host == (rank - 1) % size).all()
        into2 = FakeGpuArray.zeros(2, np.float64)
        w2 = started(pg.irecv(into2, (rank - 1) % size, tag=5))
        pg.send(FakeGpuArray(np.full(2, 7.0)), (rank + 1) % size, tag=5)
        w2.wait()
        assert (into2.host == 7.0).all()
    aw = FakeGpuArray(np.ones(3))
    started(pg.all_reduce(aw, async_op=True)).wait()
    assert (aw.host == size).all()


@check
def check_bad_input(rank: int, size: int, opts: dict[str, Any]) -> None:
    strided = np.zeros((4, 4))[:, 1]
    raises(errors.InvalidArrayError, lambda: pg.all_reduce(strided), "C-contiguous")
    ro = np.zeros(3)
    ro.setflags(write=False)
    raises(errors.InvalidArrayError, lambda: pg.all_reduce(ro), "read-only")
    raises(errors.InvalidArrayError, lambda: pg.all_reduce([1, 2, 3]), "list")
    raises(errors.InvalidArrayError, lambda: pg.all_reduce(np.array(["a"])), "dtype")
    swapped = np.arange(3, dtype=np.dtype(np.float32).newbyteorder())
    raises(errors.InvalidArrayError, lambda: pg.all_reduce(swapped), "byte order")
    raises(errors.InvalidArrayError, lambda: pg.broadcast(swapped, 0), "byte order")
    assert_equal(swapped, np.arange(3, dtype=np.float32), "a refused array is left as it was")
    raises(errors.UnsupportedOperationError, lambda: pg.all_reduce(np.zeros(2), op=ReduceOp.BAND), "BAND")
    raises(errors.UnsupportedOperationError, lambda: pg.all_reduce(np.zeros(2, np.complex64), op=ReduceOp.MAX), "complex")
    raises(errors.UnsupportedOperationError, lambda: pg.all_reduce(np.zeros(2, np.int32), op=ReduceOp.AVG), "AVG")
    raises(errors.UnsupportedOperationError,
           lambda: pg.all_reduce(np.zeros(2), op="sum"), "ReduceOp")  # type: ignore[arg-type]  # the wrong type is the check
    raises(errors.InvalidArgumentError, lambda: pg.broadcast(np.zeros(2), size), f"src={size}")
    raises(errors.InvalidArgumentError, lambda: pg.send(np.zeros(2), rank), "own rank")
    raises(errors.InvalidArgumentError, lambda: pg.send(np.zeros(2), size + 3), "not a rank")
    raises(errors.InvalidArgumentError, lambda: pg.send(np.zeros(2), (rank + 1) % max(size, 2), tag=-1), "tag")
    raises(errors.InvalidArgumentError, lambda: pg.all_gather([np.zeros(2)] * (size + 1), np.zeros(2)), "ranks")
    raises(errors.InvalidArrayError,
           lambda: pg.all_gather([np.zeros(3, np.float32) for _ in range(size)], np.zeros(2, np.float32)), "must match")
    raises(errors.InvalidArgumentError, lambda: pg.gather(np.zeros(1), None, dst=rank), "gather_list")
    raises(errors.InvalidArgumentError, lambda: pg.scatter(np.zeros(1), None, src=rank), "scatter_list")
    raises(errors.InvalidArgumentError, lambda: pg.new_group([0, 0]), "duplicates")
    raises(errors.InvalidArgumentError, lambda: pg.new_group([size]), "outside")
    raises(errors.AlreadyInitializedError, lambda: pg.init_process_group(opts["backend"]))
    pg.barrier()  # nothing above sent a byte: the ranks are still in step


@check
def check_info(rank: int, size: int, opts: dict[str, Any]) -> None:
    assert pg.is_initialized()
    assert pg.get_rank() == rank and pg.get_world_size() == size
    assert pg.get_backend() == opts["backend"]
    assert pg.is_available()


def run_all(rank: int, size: int, opts: dict[str, Any], names: list[str]) -> dict[str, str | None]:
    """Run the named checks in order; returns name -> None (passed) or the traceback."""
    import traceback

    results: dict[str, str | None] = {}
    for name in names:
        try:
            CHECKS[name](rank, size, opts)
            results[name] = None
        except Exception:  # noqa: BLE001 - reported per check
            results[name] = traceback.format_exc()
        pg.barrier()
    return results
