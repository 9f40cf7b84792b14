"""The nccl backend: what runs anywhere, and what needs CUDA GPUs (skipped without them).

Without a GPU: listing and the availability reason (in a fresh interpreter), the init
error, the dtype/op tables (checked by emulating each NCCL op with NumPy against the
core's reductions), unique-id exchange and check-in over a real Store from threads,
and the real NcclChannel class in 2 real processes (registered at run time as
"nccl_nogpu", so the GPU check is skipped): everything it refuses before touching a
GPU, the core's host-array error, object collectives over the tcp side group.

With GPUs: one process (world size 1) runs every op, the multi-GPU calls, streams,
async Work and the communicator cache on GPU 0; two processes run the ops between
ranks when there are two GPUs (NCCL refuses two ranks of one communicator on the same
GPU: "Duplicate GPU detected").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import procgroup as pg
import pytest
from procgroup import errors
from procgroup.ops import ReduceOp, check_op_dtype, reduce_into
from procgroup.plugins import backends
from procgroup.testing import FakeGpuArray, spawn

pytestmark = pytest.mark.timeout(600)

_PROBE = (
    "import json; from procgroup_nccl._availability import unavailable_reason, cuda_device_count;"
    "r = unavailable_reason(); n = cuda_device_count()[0] if r is None else 0;"
    "print(json.dumps({'reason': r, 'gpus': n}))"
)


def _probe() -> dict[str, Any]:
    """Ask a fresh interpreter (so this one never initializes CUDA before spawning).

    The answer travels to spawned ranks in the environment, so they do not ask again.
    """
    cached = os.environ.get("PROCGROUP_TEST_NCCL_PROBE")
    if cached:
        return json.loads(cached)
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True)
    line = out.stdout.strip().splitlines()[-1]
    os.environ["PROCGROUP_TEST_NCCL_PROBE"] = line
    return json.loads(line)


PROBE = _probe()
REASON: str | None = PROBE["reason"]
GPUS: int = PROBE["gpus"]
needs_gpu = pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA GPU with NCCL: {REASON}")
needs_no_gpu = pytest.mark.skipif(REASON is None, reason="this machine has a CUDA GPU; checks the no-GPU path")
needs_2_gpus = pytest.mark.skipif(
    GPUS < 2, reason=f"needs 2 CUDA GPUs (found {GPUS}): NCCL puts each rank on its own GPU"
)


def _nccl_module() -> Any:
    try:
        from cupy.cuda import nccl
    except ImportError:
        return None
    return nccl if getattr(nccl, "available", False) else None


needs_nccl_lib = pytest.mark.skipif(_nccl_module() is None, reason="the NCCL library is not installed")


# ------------------------------------------------------------------ listing and init
def test_listed_with_cuda_device_and_distribution() -> None:
    spec = backends()["nccl"]
    assert spec.devices == ("cuda",)
    assert spec.distribution == "procgroup-nccl"
    assert "NCCL" in spec.description
    import procgroup_nccl

    for name in ("all_reduce_multigpu", "broadcast_multigpu", "reduce_multigpu", "all_gather_multigpu"):
        assert getattr(pg, name) is getattr(procgroup_nccl, name)  # published through BackendSpec.api


@needs_no_gpu
def test_unavailable_reason_names_cuda() -> None:
    assert REASON is not None and ("no CUDA device" in REASON or "cupy not installed" in REASON), REASON
    assert backends()["nccl"].unavailable() == REASON


def test_hidden_devices_give_no_cuda_device_reason() -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                         check=True, env=env)
    reason = json.loads(out.stdout.strip().splitlines()[-1])["reason"]
    assert reason.startswith("no CUDA device") and "CUDA_VISIBLE_DEVICES" in reason, reason


@needs_no_gpu
def test_init_raises_backend_unavailable() -> None:
    with pytest.raises(errors.BackendUnavailableError) as info:
        pg.init_process_group("nccl", "tcp://127.0.0.1:1", rank=0, world_size=1, timeout=5)
    assert "'nccl'" in str(info.value) and REASON in str(info.value)
    assert not pg.is_initialized()


def test_package_import_does_not_import_cupy() -> None:
    code = "import sys, procgroup_nccl, procgroup_nccl.plugin; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------ dtype / op tables
_EMULATE: dict[str, Callable[..., Any]] = {
    "SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum, "AVG": np.add,
}
_NP_OF_NCCL = {"INT8": np.int8, "UINT8": np.uint8, "INT32": np.int32, "UINT32": np.uint32, "INT64": np.int64,
               "UINT64": np.uint64, "FLOAT16": np.float16, "FLOAT32": np.float32, "FLOAT64": np.float64}
_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
           "float16", "float32", "float64", "complex64", "complex128"]


def _inputs(dtype: str, ranks: int = 3, count: int = 17) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return [rng.integers(0, 2, count).astype(bool) for _ in range(ranks)]
    if dt.kind == "c":
        return [(rng.integers(1, 4, count) + 1j * rng.integers(-3, 4, count)).astype(dt) for _ in range(ranks)]
    return [rng.integers(1, 4, count).astype(dt) for _ in range(ranks)]


@pytest.mark.parametrize("dtype", _DTYPES)
def test_reduce_plan_matches_core_semantics(dtype: str) -> None:
    """Emulate the planned NCCL op with NumPy on the planned type; compare with the core."""
    from procgroup_nccl._types import reduce_plan, reduce_table

    names = reduce_table(names=True)  # NCCL names, not cupy.cuda.nccl constants

    for op in ReduceOp:
        try:
            check_op_dtype(op, dtype)
        except errors.UnsupportedOperationError:
            continue  # the core refuses it before any backend sees it
        try:
            plan = reduce_plan(dtype, op, table=names)
        except errors.UnsupportedOperationError as exc:
            msg = str(exc)
            assert "'nccl'" in msg and op.name in msg and dtype in msg and "cuda" in msg, msg
            continue
        inputs = _inputs(dtype)
        want = inputs[0].copy()
        for other in inputs[1:]:
            reduce_into(op, want, other)
        nccl_np = _NP_OF_NCCL[plan.dtype]
        views = [a.view(nccl_np) for a in inputs]
        assert views[0].size == inputs[0].size * plan.factor
        acc = views[0].copy()
        for v in views[1:]:
            acc = _EMULATE[plan.op](acc, v).astype(nccl_np)
        got = acc.view(inputs[0].dtype)
        if op is ReduceOp.AVG:
            got = got / len(inputs)
            want = want / len(inputs)
        np.testing.assert_allclose(got.astype(want.dtype), want, rtol=1e-3, err_msg=f"{dtype} {op}")


def test_reduce_plan_refusals_and_fallback() -> None:
    from procgroup_nccl._types import NCCL_AVG_MIN_VERSION, reduce_plan, reduce_table

    with pytest.raises(errors.UnsupportedOperationError, match="bitwise"):
        reduce_plan("int32", ReduceOp.BAND)
    with pytest.raises(errors.UnsupportedOperationError, match="xor"):
        reduce_plan("bool", ReduceOp.BXOR)
    with pytest.raises(errors.UnsupportedOperationError, match="int32"):
        reduce_plan("int16", ReduceOp.SUM)
    with pytest.raises(errors.UnsupportedOperationError, match="pairs"):
        reduce_plan("complex64", ReduceOp.PRODUCT)
    with pytest.raises(errors.UnsupportedOperationError, match="ReduceOp"):
        reduce_plan("float32", "sum")  # type: ignore[arg-type]  # a bad argument on purpose
    old = reduce_plan("float32", ReduceOp.AVG, table=reduce_table(NCCL_AVG_MIN_VERSION - 1, names=True))
    assert (old.op, old.divide) == ("SUM", True)
    new = reduce_plan("complex128", ReduceOp.AVG, table=reduce_table(NCCL_AVG_MIN_VERSION, names=True))
    assert (new.op, new.divide, new.factor) == ("AVG", False, 2)


@needs_nccl_lib
def test_table_names_resolve_in_cupy_nccl() -> None:
    from procgroup_nccl import _types

    nccl = _nccl_module()
    names = {*_types.NCCL_DTYPES.values(), *_types.NCCL_OPS.values(),
             *_types.BOOL_OPS.values(), _types.BYTE_TYPE} - {"BFLOAT16"}
    for name in sorted(names):
        assert _types.resolve(name) == getattr(nccl, f"NCCL_{name}")
    with pytest.raises(errors.UnsupportedOperationError, match="NCCL_NOPE"):
        _types.resolve("NOPE")
    plan = _types.reduce_plan("complex64", ReduceOp.SUM)  # the table resolves lazily, in cupy
    assert (plan.dtype, plan.op, plan.factor) == (nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 2)


# ------------------------------------------------------------------ unique id / check-in
def test_unique_id_conversions_round_trip() -> None:
    from procgroup_nccl._comm import uid_for_cupy, uid_to_bytes

    raw = bytes(range(256))[::2]
    as_tuple = uid_for_cupy(raw, 13)
    assert isinstance(as_tuple, tuple) and min(as_tuple) < 0 <= max(as_tuple)
    assert uid_to_bytes(as_tuple) == raw
    assert uid_for_cupy(raw, 14) == raw and uid_to_bytes(bytearray(raw)) == raw


def _threads(size: int, fn: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except Exception as exc:  # noqa: BLE001 - compared by the test
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@needs_nccl_lib
def test_unique_id_shared_through_store() -> None:
    from procgroup.rendezvous import HashStore
    from procgroup_nccl._comm import check_in, exchange_unique_id

    store = HashStore()
    ids = _threads(3, lambda r: exchange_unique_id(store, "k/uid", r, 10.0))
    assert all(isinstance(i, bytes) and len(i) == 128 for i in ids), ids
    assert ids[0] == ids[1] == ids[2]
    values = _threads(3, lambda r: check_in(store, "k/in", r, 3, f"v{r}", 10.0))
    assert values == [["v0", "v1", "v2"]] * 3


def test_check_in_times_out_naming_missing_rank() -> None:
    from procgroup.rendezvous import HashStore
    from procgroup_nccl._comm import check_in

    with pytest.raises(errors.StoreTimeoutError, match="r1"):
        check_in(HashStore(), "k/in", 0, 2, "1", 0.3)


@needs_nccl_lib
def test_multigpu_device_count_mismatch_is_refused() -> None:
    from procgroup.rendezvous import HashStore
    from procgroup_nccl._comm import create_multi_communicators

    store = HashStore()
    results = _threads(2, lambda r: create_multi_communicators(store, "m", r, 2, list(range(r + 1)), 10.0))
    for res in results:
        assert isinstance(res, errors.InvalidArgumentError) and "[1, 2]" in str(res), res


def test_blocking_wait_setting() -> None:
    from procgroup_nccl.channel import blocking_wait

    assert blocking_wait({"blocking_wait": True}) and not blocking_wait({"blocking_wait": "0"})
    old = os.environ.get("PROCGROUP_NCCL_BLOCKING_WAIT")
    try:
        os.environ["PROCGROUP_NCCL_BLOCKING_WAIT"] = "1"
        assert blocking_wait({})
        os.environ["PROCGROUP_NCCL_BLOCKING_WAIT"] = "no"
        assert not blocking_wait(None)
    finally:
        if old is None:
            os.environ.pop("PROCGROUP_NCCL_BLOCKING_WAIT", None)
        else:
            os.environ["PROCGROUP_NCCL_BLOCKING_WAIT"] = old


class _FakeInflight:
    """An Inflight without CUDA: done() when ``finish_at`` has passed; records hand-overs."""

    def __init__(self, op: str, deadline_in: float, finish_in: float | None) -> None:
        import time

        from procgroup_nccl._work import Inflight

        now = time.monotonic()
        self.inner = Inflight(op, [], (), now + deadline_in, result=1)
        self.finish_at = None if finish_in is None else now + finish_in
        self.handed = 0
        self.inner.done = self.done  # type: ignore[method-assign]  # the test drives the clock
        self.inner.hand_to_caller = self.hand  # type: ignore[method-assign]  # counts the hand-offs

    def done(self) -> bool:
        import time

        return self.inner.error is not None or (self.finish_at is not None and time.monotonic() >= self.finish_at)

    def hand(self) -> None:
        self.handed += 1


def test_work_wait_is_the_blocking_call() -> None:
    """NcclWork.wait(): stream hand-over only; host wait for barrier / blocking mode, up to
    the deadline, then abort; an explicit timeout is a soft error; watchdog errors re-raise."""
    pytest.importorskip("cupy")
    from procgroup_nccl._work import NcclWork

    aborted: list[BaseException] = []

    def work(finish_in: float | None, deadline_in: float = 5.0, **kw: Any) -> tuple[Any, _FakeInflight]:
        fake = _FakeInflight("all_reduce", deadline_in, finish_in)
        return NcclWork(fake.inner, aborted.append, 5.0, **kw), fake

    w, fake = work(None)  # the default: never blocks the host, even if the GPU never finishes
    assert w.wait() is True and fake.handed == 1 and w.result() == 1 and not aborted
    w, fake = work(0.05, host_sync=True)  # barrier: the host waits until done
    assert w.wait() and w.is_completed() and not aborted
    w, fake = work(0.05, blocking=True)  # blocking-wait mode: the same
    assert w.wait() and w.is_completed() and not aborted
    w, fake = work(None, deadline_in=0.1, host_sync=True)  # past the deadline: abort and raise
    with pytest.raises(errors.CommTimeoutError, match="aborted"):
        w.wait()
    assert len(aborted) == 1 and isinstance(aborted[0], errors.CommTimeoutError)
    w, fake = work(None, deadline_in=60.0)  # an explicit timeout: soft, the op goes on
    with pytest.raises(errors.CommTimeoutError, match=r"Work.wait\(timeout=0.05\)"):
        w.wait(timeout=0.05)
    assert len(aborted) == 1
    fake.inner.error = errors.PeerError("watchdog says no")
    with pytest.raises(errors.PeerError, match="watchdog"):
        w.wait()
    assert w.exception() is fake.inner.error


def test_register_stream_validates_and_returns_previous() -> None:
    pytest.importorskip("cupy")
    from procgroup_nccl import _register_stream
    from procgroup_nccl._streams import registered_stream

    with pytest.raises(errors.InvalidArgumentError, match="cupy.cuda.Stream"):
        _register_stream("stream")
    assert _register_stream(None) is None
    _register_stream(0)  # the legacy default stream, as a raw cudaStream_t (no GPU needed)
    assert registered_stream() is not None and int(registered_stream().ptr) == 0
    previous = _register_stream(None)
    assert int(previous.ptr) == 0 and registered_stream() is None


# ------------------------------------------------------------------ the channel, no GPU
def register_nogpu() -> None:
    """Spawn setup: the real NcclChannel under another name, without the GPU check."""
    from procgroup_nccl.channel import NcclChannel

    pg.register_backend("nccl_nogpu", NcclChannel, devices=("cuda",))


def _nogpu_checks(rank: int, size: int) -> dict[str, Any]:
    import procgroup_nccl as pn

    out: dict[str, Any] = {}

    def err(fn: Callable[[], Any]) -> str:
        try:
            fn()
        except errors.ProcGroupError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    other = (rank + 1) % size
    host = np.zeros(4, dtype=np.float32)
    fake = FakeGpuArray(np.zeros(4, dtype=np.float32))
    out["host_all_reduce"] = err(lambda: pg.all_reduce(host))
    out["host_send"] = err(lambda: pg.send(host, other))
    out["fake_all_reduce"] = err(lambda: pg.all_reduce(fake))
    out["fake_broadcast_async"] = err(lambda: pg.broadcast(fake, 0, async_op=True))
    # (not all_gather: the core's list check reads .size, which FakeGpuArray lacks; reported)
    out["fake_scatter"] = err(lambda: pg.scatter(fake, None, src=other))
    out["any_source"] = err(lambda: pg.recv(fake))
    out["fake_irecv"] = err(lambda: pg.irecv(fake, other))
    out["multigpu_host"] = err(lambda: pn.all_reduce_multigpu([host]))
    out["multigpu_empty"] = err(lambda: pn.broadcast_multigpu([], 0))
    out["multigpu_fake"] = err(lambda: pn.all_reduce_multigpu([fake]))
    ro = FakeGpuArray(np.zeros(2))
    ro.host.setflags(write=False)
    out["multigpu_read_only"] = err(lambda: pn.all_reduce_multigpu([ro]))
    out["multigpu_src_tensor"] = err(lambda: pn.broadcast_multigpu([fake], 0, src_tensor=3))
    out["clear_cache"] = pn._clear_group_cache()
    gathered: list[Any] = [None] * size
    pg.all_gather_object(gathered, {"rank": rank})  # tcp side group under a cuda-only world
    out["objects"] = [g["rank"] for g in gathered]
    side = pg.new_group(backend="tcp")
    out["multigpu_tcp_group"] = err(lambda: pn.all_reduce_multigpu([fake], group=side))
    out["clear_cache_tcp"] = pn._clear_group_cache(side)
    arr = np.full(3, rank + 1.0)
    pg.all_reduce(arr, group=side)
    out["side_sum"] = arr.tolist()
    return out


def test_channel_without_gpu_in_two_processes() -> None:
    pytest.importorskip("cupy")
    if _nccl_module() is None:
        pytest.skip("the NCCL library is not installed (NcclChannel reads its version)")
    size = 2
    results = spawn(_nogpu_checks, size, "nccl_nogpu", setup=register_nogpu, timeout=60, job_timeout=240)
    for rank, out in enumerate(results):
        for key in ("host_all_reduce", "host_send"):
            assert out[key].startswith("UnsupportedOperationError") and "cupy.asarray" in out[key], out[key]
            assert "new_group(backend='tcp')" in out[key], out[key]
        for key in ("fake_all_reduce", "fake_broadcast_async", "fake_scatter", "fake_irecv", "multigpu_fake"):
            assert out[key].startswith("InvalidArrayError") and "fake GPU array" in out[key], (key, out[key])
        assert out["any_source"].startswith("UnsupportedOperationError") and "src=" in out["any_source"]
        assert out["multigpu_host"].startswith("UnsupportedOperationError") and "host memory" in out["multigpu_host"]
        assert out["multigpu_empty"].startswith("InvalidArgumentError") and "non-empty" in out["multigpu_empty"]
        assert out["multigpu_read_only"].startswith("InvalidArrayError") and "read-only" in out["multigpu_read_only"]
        assert out["multigpu_src_tensor"].startswith("InvalidArgumentError") and "src_tensor" in out["multigpu_src_tensor"]
        assert out["multigpu_tcp_group"].startswith("UnsupportedOperationError") and "'tcp'" in out["multigpu_tcp_group"]
        assert out["clear_cache"] == 0 and out["clear_cache_tcp"] == 0
        assert out["objects"] == list(range(size))
        assert out["side_sum"] == [float(sum(range(1, size + 1)))] * 3, (rank, out["side_sum"])


# ------------------------------------------------------------------ with a GPU
def _gpu_world_one(rank: int, size: int) -> dict[str, Any]:
    """World size 1 on GPU 0: every op, async Work, streams, multi-GPU, the cache."""
    import cupy as cp
    import procgroup_nccl as pn

    cp.cuda.Device(0).use()
    out: dict[str, Any] = {}
    for dtype in ["float32", "float64", "float16", "int8", "int32", "int64", "uint8", "bool", "complex64", "complex128"]:
        base = _inputs(dtype, ranks=1, count=1001)[0]
        for op in ReduceOp:
            try:
                check_op_dtype(op, dtype)
            except errors.UnsupportedOperationError:
                continue
            arr = cp.asarray(base)
            try:
                pg.all_reduce(arr, op=op)
            except errors.UnsupportedOperationError:
                out.setdefault("refused", []).append(f"{dtype}/{op.name}")
                continue
            assert np.allclose(cp.asnumpy(arr).astype(np.complex128), base.astype(np.complex128)), (dtype, op)
        b = cp.asarray(base)
        pg.broadcast(b, 0)
        pg.reduce(b, 0)
        outs = [cp.zeros_like(b)]
        pg.all_gather(outs, b)
        assert np.array_equal(cp.asnumpy(outs[0]), base), dtype
        g = [cp.zeros_like(b)]
        pg.gather(b, g, dst=0)
        s = cp.zeros_like(b)
        pg.scatter(s, [b], src=0)
        rs = cp.zeros_like(b)
        pg.reduce_scatter(rs, [b], op=ReduceOp.MAX if dtype != "complex64" and dtype != "complex128" else ReduceOp.SUM)
        a2a = [cp.zeros_like(b)]
        pg.all_to_all(a2a, [b])
        for name, got in (("gather", g[0]), ("scatter", s), ("reduce_scatter", rs), ("all_to_all", a2a[0])):
            assert np.array_equal(cp.asnumpy(got), base), (dtype, name)
    # async on a registered user stream; the Work orders that stream after the op
    user = cp.cuda.Stream(non_blocking=True)
    pn._register_stream(user)
    with user:
        x = cp.arange(1 << 20, dtype=cp.float32)
        w = pg.all_reduce(x, op=ReduceOp.AVG, async_op=True)
        w.wait()
        y = x * 2
    user.synchronize()
    out["async_done"] = w.is_completed()
    out["async_ok"] = bool(cp.allclose(y, cp.arange(1 << 20, dtype=cp.float32) * 2))
    pn._register_stream(None)
    bw = pg.barrier(async_op=True)
    out["barrier_wait"] = bw.wait(timeout=60)
    pg.barrier()
    # multi-GPU list variants with one GPU per process
    m = cp.arange(10, dtype=cp.float64)
    pn.all_reduce_multigpu([m])
    pn.broadcast_multigpu([m], 0)
    pn.reduce_multigpu([m], 0)
    mo = [[cp.zeros(10)]]
    pn.all_gather_multigpu(mo, [m])
    out["multigpu"] = bool(cp.array_equal(mo[0][0], cp.arange(10, dtype=cp.float64)))
    out["cleared"] = pn._clear_group_cache()
    z = cp.ones(5, dtype=cp.int32)
    pg.all_reduce(z)  # a new communicator after the cache was cleared
    out["after_clear"] = cp.asnumpy(z).tolist()
    sub = pg.new_group([0])
    z2 = cp.full(3, 2.0)
    pg.all_reduce(z2, op=ReduceOp.PRODUCT, group=sub)
    out["subgroup"] = cp.asnumpy(z2).tolist()
    objs: list[Any] = [None]
    pg.all_gather_object(objs, {"r": rank})
    out["objects"] = objs
    try:
        pg.all_reduce(np.zeros(2))
    except errors.UnsupportedOperationError as exc:
        out["host_error"] = str(exc)
    return out


@needs_gpu
def test_gpu_world_size_one() -> None:
    (out,) = spawn(_gpu_world_one, 1, "nccl", timeout=120, job_timeout=500)
    assert out["async_done"] and out["async_ok"] and out["barrier_wait"] is True
    assert out["multigpu"] and out["cleared"] >= 1
    assert out["after_clear"] == [1] * 5 and out["subgroup"] == [2.0] * 3
    assert out["objects"] == [{"r": 0}]
    assert "cupy.asarray" in out["host_error"]
    assert set(out.get("refused", [])) <= {"bool/BXOR", "int8/BAND", "int8/BOR", "int8/BXOR", "int32/BAND",
                                           "int32/BOR", "int32/BXOR", "int64/BAND", "int64/BOR", "int64/BXOR",
                                           "uint8/BAND", "uint8/BOR", "uint8/BXOR"}


def _gpu_two_ranks(rank: int, size: int) -> dict[str, Any]:
    """Two processes, GPU = rank: results checked against NumPy on every rank."""
    import cupy as cp

    cp.cuda.Device(rank).use()
    out: dict[str, Any] = {}
    inputs = {r: _inputs("float32", ranks=size, count=4099)[r] for r in range(size)}
    mine = cp.asarray(inputs[rank])
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG):
        want = inputs[0].copy()
        for r in range(1, size):
            reduce_into(op, want, inputs[r])
        if op is ReduceOp.AVG:
            want /= size
        arr = mine.copy()
        pg.all_reduce(arr, op=op)
        out[f"all_reduce_{op.name}"] = bool(np.allclose(cp.asnumpy(arr), want))
    c = cp.asarray(_inputs("complex128", ranks=size)[rank])
    pg.all_reduce(c)
    out["complex_sum"] = bool(np.allclose(cp.asnumpy(c), sum(_inputs("complex128", ranks=size))))
    b = mine.copy()
    pg.broadcast(b, 1)
    out["broadcast"] = bool(np.array_equal(cp.asnumpy(b), inputs[1]))
    outs = [cp.zeros_like(mine) for _ in range(size)]
    pg.all_gather(outs, mine)
    out["all_gather"] = all(np.array_equal(cp.asnumpy(o), inputs[r]) for r, o in enumerate(outs))
    parts = [mine + r for r in range(size)]
    rs = cp.zeros_like(mine)
    pg.reduce_scatter(rs, parts)
    out["reduce_scatter"] = bool(np.allclose(cp.asnumpy(rs), sum(inputs.values()) + size * rank))
    a2a = [cp.zeros_like(mine) for _ in range(size)]
    pg.all_to_all(a2a, parts)
    out["all_to_all"] = all(np.allclose(cp.asnumpy(o), inputs[r] + rank) for r, o in enumerate(a2a))
    gl = [cp.zeros_like(mine) for _ in range(size)] if rank == 0 else None
    pg.gather(mine, gl, dst=0)
    if rank == 0:
        out["gather"] = all(np.array_equal(cp.asnumpy(o), inputs[r]) for r, o in enumerate(gl))
    sc = cp.zeros_like(mine)
    pg.scatter(sc, parts if rank == 1 else None, src=1)
    out["scatter"] = bool(np.allclose(cp.asnumpy(sc), inputs[1] + rank))
    into = cp.zeros_like(mine)
    other = 1 - rank
    w = pg.isend(mine, other)
    out["recv_from"] = pg.recv(into, other)
    w.wait()
    out["send_recv"] = bool(np.array_equal(cp.asnumpy(into), inputs[other]))
    # a collective the peer never joins: blocking wait turns it into CommTimeoutError
    pg.barrier()
    if rank == 0:
        try:
            pg.all_reduce(cp.ones(4), async_op=True).wait(timeout=3)
            out["lonely"] = "no error"
        except errors.CommTimeoutError as exc:
            out["lonely"] = type(exc).__name__
    return out


@needs_2_gpus
def test_gpu_two_processes() -> None:
    results = spawn(_gpu_two_ranks, 2, "nccl", timeout=30, job_timeout=500)
    for rank, out in enumerate(results):
        failed = [k for k, v in out.items() if v is False]
        assert not failed, (rank, failed)
        assert out["recv_from"] == 1 - rank
    assert results[0]["gather"] is True and results[0]["lonely"] == "CommTimeoutError"
