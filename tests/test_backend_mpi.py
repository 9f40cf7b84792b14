"""The mpi backend: the conformance suite under a real mpiexec, plus MPI-specific checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any

import numpy as np
import pytest
from _installed import require_mpi

from procgroup.testing import ConformanceSuite, mpiexec_command, spawn
from procgroup.testing._huge import over_2gib, skip_unless_memory

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _mpi_installed() -> None:
    require_mpi()


class TestMpiConformance(ConformanceSuite):
    backend = "mpi"
    world_sizes = (1, 2, 3, 4)
    launcher = "mpiexec"
    init_method = None  # discover_world: mpiexec says rank and size
    survivors_raise = False  # a dead rank makes mpiexec end the whole job


# ----------------------------------------------------------------------------- mpi-specific


def _launcher_env() -> tuple[int, int]:
    """Rank and size as mpiexec's process manager tells them (PMI/Open MPI/PMIx)."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def _discover(rank: int, size: int) -> dict[str, Any]:
    """Init with no init_method/rank/size, then with arguments that contradict mpiexec."""
    import procgroup as pg
    from procgroup.errors import ChannelClosedError, InvalidArgumentError

    out: dict[str, Any] = {"env": _launcher_env()}
    hook = sys.excepthook
    pg.init_process_group("mpi", timeout=60)
    out["hook_installed"] = sys.excepthook is not hook  # mpiexec's world is procgroup's
    out["found"] = (pg.get_rank(), pg.get_world_size())
    arr = np.full(3, pg.get_rank() + 1.0)
    pg.all_reduce(arr)
    out["sum"] = float(arr[0])
    ch = pg.group_channel()
    pg.destroy_process_group()
    out["hook_restored"] = sys.excepthook is hook
    closed = {}
    for name, call in (("all_reduce", lambda: ch.run("all_reduce", np.ones(2), pg.ReduceOp.SUM)),
                       ("broadcast", lambda: ch.start("broadcast", np.ones(2), 0)),
                       ("send", lambda: ch.send(np.ones(2), (rank + 1) % size, 5))):
        try:
            call()
            closed[name] = "no error"
        except ChannelClosedError as exc:
            closed[name] = str(exc)
    out["closed"] = closed
    # arguments that differ from MPI's are ignored with a warning (torch's MPI recipes:
    # rank=0, world_size=0 in today's tutorial, rank=0, world_size=1 in the 2017 one)
    ignored = {}
    for name, kw in (("world_size", {"world_size": size + 1}), ("rank", {"rank": (rank + 1) % size}),
                     ("torch", {"rank": 0, "world_size": 0}), ("torch2017", {"rank": 0, "world_size": 1})):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                pg.init_process_group("mpi", timeout=60, **kw)
            except InvalidArgumentError as exc:
                ignored[name] = ("error", str(exc))
                continue
        ignored[name] = ((pg.get_rank(), pg.get_world_size()),
                         [str(w.message) for w in caught if "ignored" in str(w.message)])
        pg.destroy_process_group()
    out["ignored"] = ignored
    # matching arguments are accepted
    pg.init_process_group("mpi", timeout=60, rank=rank, world_size=size)
    out["again"] = (pg.get_rank(), pg.get_world_size())
    pg.destroy_process_group()
    return out


def test_discover_world_under_mpiexec() -> None:
    size = 3
    results = spawn(_discover, size, "mpi", launcher="mpiexec", init_method=None, init=False, timeout=60)
    for rank, res in enumerate(results):
        assert res["env"] == (rank, size)
        assert res["found"] == (rank, size)
        assert res["again"] == (rank, size)
        assert res["sum"] == size * (size + 1) / 2
        ign = res["ignored"]
        for name in ign:
            assert ign[name][0] == (rank, size), (name, ign[name])  # MPI's world, whatever was passed
        assert len(ign["world_size"][1]) == 1 and "the argument world_size=4 is ignored" in ign["world_size"][1][0]
        assert f"which says rank={rank} and world_size={size}" in ign["world_size"][1][0], ign
        assert len(ign["rank"][1]) == 1 and f"rank={(rank + 1) % size} is ignored" in ign["rank"][1][0], ign
        want = "rank=0 and world_size=0 are" if rank else "world_size=0 is"
        assert len(ign["torch"][1]) == 1 and f"the argument {want} ignored" in ign["torch"][1][0], ign
        want = "rank=0 and world_size=1 are" if rank else "world_size=1 is"
        assert len(ign["torch2017"][1]) == 1 and f"the argument {want} ignored" in ign["torch2017"][1][0], ign
        assert res["hook_installed"] is True and res["hook_restored"] is True, res
        for name, msg in res["closed"].items():
            assert "the mpi channel is closed" in msg, (name, msg)


def _singleton(rank: int, size: int) -> dict[str, Any]:
    """Without mpiexec: init_process_group('mpi') is a world of one."""
    import procgroup as pg

    pg.init_process_group("mpi", timeout=30)
    arr = np.full(4, 5.0)
    pg.all_reduce(arr, op=pg.ReduceOp.AVG)
    out = {"world": (pg.get_rank(), pg.get_world_size()), "value": float(arr[0])}
    pg.destroy_process_group()
    return out


def _mismatched_init_method(rank: int, size: int) -> str:
    """A file:// rendezvous of 2 ranks whose processes are MPI singletons: a clear error."""
    from procgroup.errors import InvalidArgumentError

    try:
        import procgroup as pg

        pg.init_process_group("mpi", os.environ["PG_TEST_URL"], rank=rank, world_size=size, timeout=30)
    except InvalidArgumentError as exc:
        return str(exc)
    return "no error"


def test_without_mpiexec(tmp_path: Any) -> None:
    assert spawn(_singleton, 1, "mpi", launcher="process", init=False) == [{"world": (0, 1), "value": 5.0}]
    url = f"file://{tmp_path}/rdv"
    messages = spawn(_mismatched_init_method, 2, "mpi", launcher="process", init=False, env={"PG_TEST_URL": url})
    for rank, msg in enumerate(messages):
        assert f"given rank {rank} of a world of 2" in msg and "rank 0 of 1" in msg and "mpiexec -n 2" in msg, msg


def _mpi_specific(rank: int, size: int) -> dict[str, Any]:
    """Tags over TAG_UB, the collective tag space, nested groups, buffer layouts, dtypes."""
    import procgroup as pg
    from mpi4py import MPI
    from procgroup.backend import DataChannel
    from procgroup.ops import ReduceOp

    ch = pg.group_channel()
    out: dict[str, Any] = {"tag_ub": int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)), "mask": ch._routes.mask}
    # user tags above MPI_TAG_UB stay distinct: sent in one order, received in reverse
    tags = sorted({0, 7, ch._routes.mask, ch._routes.mask + 1, 2**30 + 3, 2**31 - 1})
    if rank == 0:
        for i, t in enumerate(tags):
            pg.send(np.full(2, i, dtype=np.int64), 1, tag=t)
    elif rank == 1:
        got = {}
        for t in reversed(tags):
            buf = np.zeros(2, dtype=np.int64)
            pg.recv(buf, 0, tag=t)
            got[t] = int(buf[0])
        out["tags"] = got == {t: i for i, t in enumerate(tags)}
    # a receive buffer of the wrong size is a clear error, larger or smaller
    from procgroup.errors import InvalidArrayError

    # (messages travel as bytes: 12 bytes into a float64 buffer are no whole element)
    if rank == 0:
        pg.send(np.ones(3), 1, tag=11)
        pg.send(np.ones(1), 1, tag=12)
        pg.send(np.ones(3, dtype=np.float32), 1, tag=13)
    elif rank == 1:
        sizes = {}
        for tag in (11, 12, 13):
            try:
                pg.recv(np.zeros(2), 0, tag=tag)
                sizes[tag] = "no error"
            except InvalidArrayError as exc:
                sizes[tag] = str(exc)
        out["sizes"] = sizes
    # the default algorithms (send/recv on tags >= 2**40) route through the collective comm
    arr = np.full(1001, rank + 1, dtype=np.float64)
    DataChannel.do_all_reduce(ch, arr, ReduceOp.SUM)
    bc = np.full(5, rank, dtype=np.int32)
    DataChannel.do_broadcast(ch, bc, size - 1)
    out["generic"] = bool((arr == size * (size + 1) / 2).all() and (bc == size - 1).all())
    # list arguments as views of one buffer (adjacent) and as separate arrays
    big = np.zeros((size, 6), dtype=np.float32)
    pg.all_gather(list(big), np.full(6, rank, dtype=np.float32))
    ins = np.arange(size * 4, dtype=np.float64).reshape(size, 4) + rank
    rs = np.zeros(4)
    pg.reduce_scatter(rs, list(ins), op=ReduceOp.SUM)
    rs2 = np.zeros(4)
    pg.reduce_scatter(rs2, [row.copy() for row in ins], op=ReduceOp.SUM)
    want = sum(np.arange(size * 4, dtype=np.float64).reshape(size, 4)[rank] + r for r in range(size))
    out["layouts"] = bool((big[:, 0] == np.arange(size)).all() and (rs == want).all() and (rs2 == want).all())
    # float16 and bool through every op they allow
    f16 = {}
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG):
        h = np.full(3, rank + 1, dtype=np.float16)
        pg.all_reduce(h, op=op)
        f16[op.name] = float(h[0])
    out["f16"] = f16
    bools = {}
    for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.BXOR, ReduceOp.BAND):
        b = np.array([rank == 0, True, False])
        pg.all_reduce(b, op=op)
        bools[op.name] = b.tolist()
    out["bool"] = bools
    # groups: a communicator per group, and a group of a group
    odds = pg.new_group(list(range(1, size, 2)))
    head = pg.new_group([0, size - 1])
    if rank in (0, size - 1):
        x = np.array([rank], dtype=np.int64)
        pg.all_reduce(x, group=head)
        out["head"] = int(x[0])
        y = np.zeros(1, dtype=np.int64)
        if rank == size - 1:
            pg.send(np.array([42]), 0, group=head, tag=2**31 - 1)
        else:
            out["head_src"] = pg.recv(y, group=head, tag=2**31 - 1)
            out["head_val"] = int(y[0])
    if rank % 2 == 1:
        v = np.ones(2)
        pg.all_reduce(v, group=odds, async_op=True).wait(timeout=30)
        out["odds"] = float(v[0])
    pg.barrier()
    return out


def test_mpi_specific_checks() -> None:
    size = 4
    results = spawn(_mpi_specific, size, "mpi", launcher="mpiexec", init_method=None, timeout=60)
    n_odd = len(range(1, size, 2))
    for rank, res in enumerate(results):
        assert res["mask"] <= res["tag_ub"] < 2 * res["mask"] + 1, res
        if rank == 1:
            assert res["tags"] is True
            assert "larger than the receive buffer" in res["sizes"][11], res["sizes"]
            assert "has 1 elements" in res["sizes"][12] and "sizes must match" in res["sizes"][12], res["sizes"]
            assert "from rank 0 has 12 bytes but the receive buffer has 2 (dtype float64)" in res["sizes"][13], res
        assert res["generic"] is True and res["layouts"] is True, res
        assert res["f16"] == {"SUM": size * (size + 1) / 2, "PRODUCT": float(np.prod(np.arange(1, size + 1))),
                              "MIN": 1.0, "MAX": float(size), "AVG": (size + 1) / 2}, res
        assert res["bool"] == {"SUM": [True, True, False], "MIN": [size == 1, True, False],
                               "BXOR": [True, size % 2 == 1, False], "BAND": [size == 1, True, False]}, res
        if rank in (0, size - 1):
            assert res["head"] == size - 1
        if rank == 0:
            assert (res["head_src"], res["head_val"]) == (size - 1, 42)
        if rank % 2 == 1:
            assert res["odds"] == n_odd


def _late_rank(rank: int, size: int) -> dict[str, Any]:
    """The last rank comes late to an all_gather, then never to a new_group."""
    import gc
    import time

    import procgroup as pg
    from procgroup.errors import CommTimeoutError

    out: dict[str, Any] = {}
    late = size - 1
    n = 8192  # 64 KiB per rank: freed memory of this size is reused by the next allocation
    if rank == late:
        time.sleep(3)
    else:
        outputs = [np.zeros(n) for _ in range(size)]
        try:
            pg.all_gather(outputs, np.full(n, rank + 1.0))
            out["gather"] = "no timeout"
        except CommTimeoutError as exc:
            out["gather"] = str(exc)
        del outputs  # MPI still owns these buffers until the late rank joins
        gc.collect()
        fresh = [np.full(n, -7.0) for _ in range(size)]
    if rank == late:
        outputs = [np.zeros(n) for _ in range(size)]
        pg.all_gather(outputs, np.full(n, rank + 1.0))
        out["late_gather"] = [float(o[0]) for o in outputs]
    pg.barrier()  # after the late rank joined, the abandoned all_gather has completed
    if rank != late:
        out["fresh_intact"] = all(bool((f == -7.0).all()) for f in fresh)
        try:
            pg.new_group(list(range(size)))
            out["new_group"] = "no timeout"
        except CommTimeoutError as exc:
            out["new_group"] = str(exc)
    else:
        time.sleep(3)
    return out


def test_late_rank_times_out_without_corrupting_memory() -> None:
    size = 3
    # timeout 2 s: the others give up on the all_gather at 2 s and wait in the barrier
    # until 4 s; the late rank joins both at 3 s
    results = spawn(_late_rank, size, "mpi", launcher="mpiexec", init_method=None, timeout=2.0)
    assert results[-1]["late_gather"] == [float(r + 1) for r in range(size)]
    for res in results[:-1]:
        assert "all_gather" in res["gather"] and "did not complete" in res["gather"], res
        assert res["fresh_intact"] is True, res  # the late op wrote into kept buffers, not into these
        assert f"[{size - 1}] did not create the group" in res["new_group"], res


def _file_rendezvous(rank: int, size: int, names: list[str], tmpdir: str) -> dict[str, str | None]:
    """The checks that need a shared Store, with file:// under mpiexec."""
    from procgroup.testing import _checks

    results = _checks.run_all(rank, size, {"backend": "mpi", "tmpdir": tmpdir}, names)
    # an explicit init_method: procgroup's world is not mpiexec's, the excepthook stays
    hook = sys.excepthook
    results["excepthook"] = f"replaced by {hook!r}" if "abort_on_exception" in getattr(hook, "__qualname__", "") else None
    return results


def test_file_rendezvous_side_group(tmp_path: Any) -> None:
    names = ["info", "side_group", "groups", "all_reduce_large"]
    results = spawn(_file_rendezvous, 3, "mpi", args=(names, str(tmp_path)), launcher="mpiexec",
                    init_method="file", timeout=60)
    failures = {(rank, n): tb for rank, res in enumerate(results) for n, tb in res.items() if tb}
    assert not failures, failures


def _sized_fake_gpu() -> type:
    """FakeGpuArray with CuPy's ``size``, which the core's list check reads on unstaged arrays."""
    from procgroup.testing import FakeGpuArray

    class SizedFakeGpuArray(FakeGpuArray):
        @property
        def size(self) -> int:
            return int(self.host.size)

    return SizedFakeGpuArray


def _cuda_aware_direct(rank: int, size: int) -> dict[str, Any]:
    """PROCGROUP_MPI_CUDA_AWARE=1: device arrays go to MPI as pointers, unstaged."""
    import procgroup as pg

    FakeGpuArray = _sized_fake_gpu()

    ch = pg.group_channel()
    a = FakeGpuArray(np.full(7, rank + 1, dtype=np.float32))
    pg.all_reduce(a)
    b = FakeGpuArray(np.full(3, rank, dtype=np.int64))
    pg.broadcast(b, size - 1)
    outs = [FakeGpuArray.zeros(2, np.int32) for _ in range(size)]
    pg.all_gather(outs, FakeGpuArray(np.full(2, rank, dtype=np.int32)))
    into = FakeGpuArray.zeros(4, np.float64)
    w = pg.isend(FakeGpuArray(np.full(4, rank, dtype=np.float64)), (rank + 1) % size)
    src = pg.recv(into, (rank - 1) % size)
    w.wait()
    return {"devices": list(ch.devices), "sum": float(a.host[0]), "bcast": int(b.host[0]),
            "gather": [int(o.host[0]) for o in outs], "recv": (src, float(into.host[0]))}


def test_cuda_aware_path_with_device_pointers() -> None:
    size = 2
    results = spawn(_cuda_aware_direct, size, "mpi", launcher="mpiexec", init_method=None,
                    env={"PROCGROUP_MPI_CUDA_AWARE": "1"}, timeout=60)
    for rank, res in enumerate(results):
        assert res == {"devices": ["cpu", "cuda"], "sum": 3.0, "bcast": size - 1, "gather": [0, 1],
                       "recv": ((rank - 1) % size, float((rank - 1) % size))}, res


ABORT_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import procgroup as pg

    pg.init_process_group("mpi", timeout=300)
    if pg.get_rank() == 1:
        raise RuntimeError("rank one fails on purpose")
    for _ in range(10**6):  # the others would wait for rank 1 for 300 s
        pg.all_reduce(np.ones(4))
    print("finished", pg.get_rank(), flush=True)
""")


def test_uncaught_exception_aborts_the_job(tmp_path: Any) -> None:
    script = tmp_path / "fails.py"
    script.write_text(ABORT_SCRIPT)
    # the subprocess timeout only guards the test run; the job ends as soon as rank 1 aborts
    proc = subprocess.run(mpiexec_command() + ["-n", "3", sys.executable, str(script)], check=False,
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "rank one fails on purpose" in proc.stderr
    assert "procgroup mpi: rank 1 raised RuntimeError; aborting the MPI job" in proc.stderr
    assert "finished" not in proc.stdout


@pytest.mark.skipif(os.environ.get("PROCGROUP_SKIP_HUGE") == "1", reason="PROCGROUP_SKIP_HUGE=1")
def test_messages_over_2gib() -> None:
    nbytes = 2**31 + 4099  # an element count over INT_MAX: MPI-4 large counts
    skip_unless_memory(5 * nbytes)
    results = spawn(over_2gib, 2, "mpi", args=(nbytes,), launcher="mpiexec", init_method=None, timeout=300,
                    job_timeout=500)
    assert results == [{"bcast": True, "p2p": True, "max": True}] * 2
