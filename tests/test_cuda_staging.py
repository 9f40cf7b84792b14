"""CUDA arrays on a CPU backend: the core stages them through host memory and copies back.

Runs without a GPU: procgroup.testing.FakeGpuArray exposes ``__cuda_array_interface__``
over host memory (``_procgroup_host_backed``), so the real staging path of the core
(arrays.stage_to_host / copy_back) runs on tcp with 3 real processes. One job runs every
collective and point-to-point call, blocking and async; each rank returns what it saw
and the test compares with values rebuilt here from the rank numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import procgroup as pg
import pytest
from procgroup import errors
from procgroup.ops import ReduceOp, reduce_into
from procgroup.testing import FakeGpuArray, spawn

pytestmark = pytest.mark.timeout(300)

SIZE = 3
DTYPES = ["float32", "float64", "int32", "int64", "uint8", "bool", "complex64"]


def data(rank: int, dtype: str, count: int = 7, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input, rebuilt identically by every rank and by the test."""
    rng = np.random.default_rng([salt, rank, count])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind == "c":
        return (rng.integers(1, 3, count) + 1j * rng.integers(0, 3, count)).astype(dt)
    return rng.integers(1, 3, count).astype(dt)


class StridedCuda:
    """A device-array look-alike whose layout is not C-contiguous."""

    _procgroup_host_backed = True

    def __init__(self) -> None:
        self.host = np.zeros((4, 4), dtype=np.float32)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (4,), "typestr": "<f4", "data": (self.host.ctypes.data, False),
                "strides": (16,), "version": 3}


def _staging_job(rank: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    peers = range(size)
    for dtype in DTYPES:
        # all_reduce with every op the dtype allows, blocking and async
        for op in ReduceOp:
            try:
                arr = FakeGpuArray(data(rank, dtype))
                pg.all_reduce(arr, op=op)
            except errors.UnsupportedOperationError:
                continue
            out[f"all_reduce/{dtype}/{op.name}"] = arr.host
        aw = FakeGpuArray(data(rank, dtype))
        pg.all_reduce(aw, async_op=True).wait(timeout=60)
        out[f"all_reduce_async/{dtype}"] = aw.host
        b = FakeGpuArray(data(rank, dtype))
        pg.broadcast(b, size - 1)
        out[f"broadcast/{dtype}"] = b.host
        r = FakeGpuArray(data(rank, dtype))
        pg.reduce(r, 1 % size)
        out[f"reduce/{dtype}"] = r.host
        outs = [FakeGpuArray.zeros(7, dtype) for _ in peers]
        pg.all_gather(outs, FakeGpuArray(data(rank, dtype)))
        out[f"all_gather/{dtype}"] = [o.host for o in outs]
        gl = [FakeGpuArray.zeros(7, dtype) for _ in peers] if rank == 0 else None
        pg.gather(FakeGpuArray(data(rank, dtype)), gl, dst=0)
        if gl is not None:
            out[f"gather/{dtype}"] = [g.host for g in gl]
        sc = FakeGpuArray.zeros(7, dtype)
        sl = [FakeGpuArray(data(j, dtype, salt=9)) for j in peers] if rank == size - 1 else None
        pg.scatter(sc, sl, src=size - 1)
        out[f"scatter/{dtype}"] = sc.host
        rs = FakeGpuArray.zeros(7, dtype)
        pg.reduce_scatter(rs, [FakeGpuArray(data(rank, dtype, salt=j)) for j in peers])
        out[f"reduce_scatter/{dtype}"] = rs.host
        a2a = [FakeGpuArray.zeros(7, dtype) for _ in peers]
        pg.all_to_all(a2a, [FakeGpuArray(data(rank, dtype, salt=j)) for j in peers])
        out[f"all_to_all/{dtype}"] = [a.host for a in a2a]
        # point to point around the ring: blocking, then isend/irecv
        right, left = (rank + 1) % size, (rank - 1) % size
        into = FakeGpuArray.zeros(7, dtype)
        w = pg.isend(FakeGpuArray(data(rank, dtype, salt=3)), right)
        out[f"recv_from/{dtype}"] = pg.recv(into, left)
        w.wait(timeout=60)
        out[f"recv/{dtype}"] = into.host
        into2 = FakeGpuArray.zeros(7, dtype)
        rw = pg.irecv(into2, None, tag=11)
        pg.send(FakeGpuArray(data(rank, dtype, salt=4)), right, tag=11)
        rw.wait(timeout=60)
        out[f"irecv_from/{dtype}"] = rw.source_rank()
        out[f"irecv/{dtype}"] = into2.host
    # async collectives that write: results land in the fake array only after wait()
    works, arrs = [], []
    for op_name in ("broadcast", "all_gather", "reduce_scatter", "all_to_all", "scatter", "gather"):
        if op_name == "broadcast":
            a = FakeGpuArray(np.full(5, rank, dtype=np.int64))
            works.append(pg.broadcast(a, 0, async_op=True))
            arrs.append(("broadcast", [a]))
        elif op_name == "all_gather":
            lst = [FakeGpuArray.zeros(2, np.int64) for _ in peers]
            works.append(pg.all_gather(lst, FakeGpuArray(np.full(2, rank, dtype=np.int64)), async_op=True))
            arrs.append(("all_gather", lst))
        elif op_name == "reduce_scatter":
            o = FakeGpuArray.zeros(2, np.int64)
            works.append(pg.reduce_scatter(o, [FakeGpuArray(np.full(2, rank + j, dtype=np.int64)) for j in peers],
                                           async_op=True))
            arrs.append(("reduce_scatter", [o]))
        elif op_name == "all_to_all":
            lst = [FakeGpuArray.zeros(2, np.int64) for _ in peers]
            works.append(pg.all_to_all(lst, [FakeGpuArray(np.full(2, 10 * rank + j, dtype=np.int64)) for j in peers],
                                       async_op=True))
            arrs.append(("all_to_all", lst))
        elif op_name == "scatter":
            o = FakeGpuArray.zeros(2, np.int64)
            src_list = [FakeGpuArray(np.full(2, 100 + j, dtype=np.int64)) for j in peers] if rank == 0 else None
            works.append(pg.scatter(o, src_list, src=0, async_op=True))
            arrs.append(("scatter", [o]))
        else:
            gl2 = [FakeGpuArray.zeros(2, np.int64) for _ in peers] if rank == 1 else None
            works.append(pg.gather(FakeGpuArray(np.full(2, rank * 3, dtype=np.int64)), gl2, dst=1, async_op=True))
            arrs.append(("gather", gl2 or []))
    works.append(pg.barrier(async_op=True))
    for w in works:
        w.wait(timeout=60)
    for name, lst in arrs:
        out[f"async/{name}"] = [a.host.tolist() for a in lst]
    # mixed: a NumPy input gathered into fake GPU outputs
    mixed = [FakeGpuArray.zeros(3, np.float64) for _ in peers]
    pg.all_gather(mixed, np.full(3, rank + 0.5))
    out["mixed"] = [m.host.tolist() for m in mixed]
    # bad input is refused before anything is sent
    ro = FakeGpuArray(np.zeros(3))
    ro.host.setflags(write=False)
    for label, call in (
        ("read_only_all_reduce", lambda: pg.all_reduce(ro)),
        ("read_only_recv", lambda: pg.recv(ro, (rank + 1) % size)),
        ("strided", lambda: pg.all_reduce(StridedCuda())),
        ("complex_max", lambda: pg.all_reduce(FakeGpuArray(np.zeros(2, np.complex64)), op=ReduceOp.MAX)),
    ):
        try:
            call()
            out[label] = "no error"
        except errors.ProcGroupError as exc:
            out[label] = f"{type(exc).__name__}: {exc}"
    # a read-only device array may be sent (nothing is written into it)
    if size > 1:
        if rank == 0:
            pg.send(ro, 1)
        elif rank == 1:
            got = FakeGpuArray(np.ones(3))
            pg.recv(got, 0)
            out["read_only_sent"] = got.host.tolist()
    pg.barrier()
    return out


def _reduce(dtype: str, op: ReduceOp, inputs: list[np.ndarray]) -> np.ndarray:
    acc = inputs[0].copy()
    for other in inputs[1:]:
        reduce_into(op, acc, other)
    if op is ReduceOp.AVG:
        acc = acc / len(inputs)
    return acc


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return spawn(_staging_job, SIZE, "tcp", timeout=60, job_timeout=240)


@pytest.mark.parametrize("dtype", DTYPES)
def test_collectives_stage_and_copy_back(results: list[dict[str, Any]], dtype: str) -> None:
    size = SIZE
    for rank, out in enumerate(results):
        ops = [k.split("/")[2] for k in out if k.startswith(f"all_reduce/{dtype}/")]
        assert "SUM" in ops, ops
        for name in ops:
            op = ReduceOp[name]
            want = _reduce(dtype, op, [data(r, dtype) for r in range(size)])
            np.testing.assert_allclose(out[f"all_reduce/{dtype}/{name}"], want.astype(np.dtype(dtype)),
                                       rtol=1e-5, err_msg=f"rank {rank} {dtype} {name}")
        np.testing.assert_array_equal(out[f"all_reduce_async/{dtype}"],
                                      _reduce(dtype, ReduceOp.SUM, [data(r, dtype) for r in range(size)]))
        np.testing.assert_array_equal(out[f"broadcast/{dtype}"], data(size - 1, dtype))
        reduced = _reduce(dtype, ReduceOp.SUM, [data(r, dtype) for r in range(size)])
        np.testing.assert_array_equal(out[f"reduce/{dtype}"], reduced if rank == 1 % size else data(rank, dtype))
        for j, got in enumerate(out[f"all_gather/{dtype}"]):
            np.testing.assert_array_equal(got, data(j, dtype))
        if rank == 0:
            for j, got in enumerate(out[f"gather/{dtype}"]):
                np.testing.assert_array_equal(got, data(j, dtype))
        np.testing.assert_array_equal(out[f"scatter/{dtype}"], data(rank, dtype, salt=9))
        np.testing.assert_array_equal(
            out[f"reduce_scatter/{dtype}"],
            _reduce(dtype, ReduceOp.SUM, [data(r, dtype, salt=rank) for r in range(size)]),
        )
        for j, got in enumerate(out[f"all_to_all/{dtype}"]):
            np.testing.assert_array_equal(got, data(j, dtype, salt=rank))
        left = (rank - 1) % size
        assert out[f"recv_from/{dtype}"] == left and out[f"irecv_from/{dtype}"] == left
        np.testing.assert_array_equal(out[f"recv/{dtype}"], data(left, dtype, salt=3))
        np.testing.assert_array_equal(out[f"irecv/{dtype}"], data(left, dtype, salt=4))


def test_async_results_copied_back_on_wait(results: list[dict[str, Any]]) -> None:
    size = SIZE
    for rank, out in enumerate(results):
        assert out["async/broadcast"] == [[0] * 5]
        assert out["async/all_gather"] == [[j, j] for j in range(size)]
        assert out["async/reduce_scatter"] == [[sum(r + rank for r in range(size))] * 2]
        assert out["async/all_to_all"] == [[10 * j + rank] * 2 for j in range(size)]
        assert out["async/scatter"] == [[100 + rank] * 2]
        assert out["async/gather"] == ([[3 * j] * 2 for j in range(size)] if rank == 1 else [])
        assert out["mixed"] == [[j + 0.5] * 3 for j in range(size)]


def test_bad_device_arrays_are_refused(results: list[dict[str, Any]]) -> None:
    assert results[1]["read_only_sent"] == [0.0] * 3
    for out in results:
        assert out["read_only_all_reduce"].startswith("InvalidArrayError") and "read-only" in out["read_only_all_reduce"]
        assert out["read_only_recv"].startswith("InvalidArrayError") and "read-only" in out["read_only_recv"]
        assert out["strided"].startswith("InvalidArrayError") and "C-contiguous" in out["strided"]
        assert out["complex_max"].startswith("UnsupportedOperationError") and "complex" in out["complex_max"]
