"""The 2017 torch.distributed suite's checks, rewritten for procgroup and NumPy arrays.

PyTorch's test/test_distributed.py of September 2017 cannot be fetched in CI, so this
file rebuilds its checks from the documented behaviour of the 2017 module (its API:
init_process_group(backend, init_method, world_size, rank, group_name), get_rank,
get_num_processes, send/recv/isend/irecv, broadcast, all_reduce, reduce, all_gather,
gather, scatter, barrier, new_group, reduce_op), with ``import procgroup as dist`` and
NumPy arrays instead of tensors. It is launched the way test/run_test.sh launched the
original, which is what the fidelity is about:

- tcp: ``BACKEND=tcp WORLD_SIZE=3 [INIT_METHOD=file:///...] python test_torch2017.py``;
  the manager process forks 3 ranks per test, each setting RANK in the environment and
  calling ``init_process_group(init_method=INIT_METHOD, backend=BACKEND,
  world_size=WORLD_SIZE)`` (env:// by default, MASTER_ADDR/MASTER_PORT set by the
  manager; with file:// the ranks come from arrival order). The ranks end with
  ``sys.exit(0)`` inside a multiprocessing child, which leaves through ``os._exit``:
  nobody calls destroy_process_group, so the next test's group on the same file or port
  must not notice the last one.
- mpi: ``BACKEND=mpi [INIT_METHOD=...] mpiexec -n 3 python test_torch2017.py``; every rank
  calls ``init_process_group(init_method=INIT_METHOD, backend='mpi')`` once, at import,
  with no MASTER_ADDR and no world size: the ranks come from MPI.

Under pytest, the functions at the bottom run those four configurations (tcp+env://,
tcp+file://, mpi+env://, mpi+file://), each as one subprocess, without procgroup-run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import unittest
from pathlib import Path

import numpy as np

WORLD = 3
SUITE_TIMEOUT = 300  # seconds one configuration may take (it takes ~15-30 s)


# ------------------------------------------------------------------ the suite itself
def _array(size: int, value: float, dtype: str = "float32") -> np.ndarray:
    """The original's _build_tensor: a size x size x size block filled with ``value``."""
    return np.full((size, size, size), value, dtype=dtype)


def _ranks_of_group(dist) -> tuple[list[int], object, int]:
    """The original's group set-up: ranks [1, 2] form a group; rank 0 is not a member."""
    members = [1, 2]
    group = dist.new_group(members)
    return members, group, dist.get_rank()


_BARRIER_CALLS: list[int] = []


class _DistTestBase:
    """The checks; each runs on every rank of one world (WORLD ranks)."""

    # self.assert* come from unittest.TestCase in the concrete classes below
    def _barrier(self) -> None:
        import procgroup as dist

        dist.barrier()

    # ---------------------------------------------------------------- identity
    def test_get_rank(self) -> None:
        import procgroup as dist

        test_dir = os.path.join(os.environ["TEMP_DIR"], "test_dir")
        rank = dist.get_rank()
        if os.environ["BACKEND"] == "mpi" and "PMI_RANK" in os.environ:  # MPI's rank wins, file:// too
            self.assertEqual(rank, int(os.environ["PMI_RANK"]))
        Path(test_dir, f"{os.getpid()}").write_text(str(rank))
        self._barrier()
        ranks = sorted(int(p.read_text()) for p in Path(test_dir).iterdir())
        self.assertEqual(ranks, list(range(dist.get_num_processes())))
        self._barrier()
        if rank == 0:
            for p in Path(test_dir).iterdir():
                p.unlink()
        self._barrier()

    def test_get_num_processes(self) -> None:
        import procgroup as dist

        self.assertEqual(dist.get_num_processes(), WORLD)
        self.assertEqual(dist.get_world_size(), WORLD)
        self.assertTrue(dist.is_initialized())
        self.assertEqual(dist.get_backend(), os.environ["BACKEND"])

    # ---------------------------------------------------------------- point to point
    def test_send_recv(self) -> None:
        import procgroup as dist

        rank = dist.get_rank()
        for src in range(WORLD):  # every rank in turn sends to all others
            if src == rank:
                for dst in range(WORLD):
                    if dst != rank:
                        dist.send(_array(dst + 1, src), dst)
            else:
                buf = _array(rank + 1, -1)
                dist.recv(buf, src)
                np.testing.assert_array_equal(buf, _array(rank + 1, src))
        self._barrier()

    def test_send_recv_any_source(self) -> None:
        import procgroup as dist

        rank = dist.get_rank()
        senders = set()
        for dst in range(WORLD):
            if dst == rank:
                for _ in range(WORLD - 1):
                    buf = _array(10, -1)
                    sender = dist.recv(buf)
                    np.testing.assert_array_equal(buf, _array(10, sender))
                    senders.add(sender)
            else:
                dist.send(_array(10, rank), dst)
        self.assertEqual(senders, set(range(WORLD)) - {rank})
        self._barrier()

    def test_isend(self) -> None:
        import procgroup as dist

        rank = dist.get_rank()
        if rank == 0:
            requests = [dist.isend(_array(dst, 10), dst) for dst in range(1, WORLD)]
            for r in requests:
                r.wait()
                self.assertTrue(r.is_completed())
        else:
            buf = _array(rank, -1)
            dist.recv(buf, 0)
            np.testing.assert_array_equal(buf, _array(rank, 10))
        self._barrier()

    def test_irecv(self) -> None:
        import procgroup as dist

        rank = dist.get_rank()
        if rank == 0:
            bufs = {src: _array(src, -1) for src in range(1, WORLD)}
            requests = [dist.irecv(bufs[src], src) for src in range(1, WORLD)]
            for r in requests:
                r.wait()
                self.assertTrue(r.is_completed())
            for src, buf in bufs.items():
                np.testing.assert_array_equal(buf, _array(src, 10))
        else:
            dist.send(_array(rank, 10), 0)
        self._barrier()

    # ---------------------------------------------------------------- collectives
    def _broadcast(self, group_ranks: list[int], group: object, rank: int) -> None:
        import procgroup as dist

        for dtype, value in (("float32", -1e-10), ("float64", -1e-100), ("int32", -1e9), ("int64", -1e18)):
            for src in group_ranks:
                expected = _array(5, value, dtype)
                buf = expected.copy() if rank == src else _array(5, 0, dtype)
                dist.broadcast(buf, src, group)
                np.testing.assert_array_equal(buf, expected)
        self._barrier()

    def test_broadcast(self) -> None:
        import procgroup as dist

        self._broadcast(list(range(WORLD)), dist.group.WORLD, dist.get_rank())

    def test_broadcast_group(self) -> None:
        members, group, rank = _ranks_of_group(__import__("procgroup"))
        if rank in members:
            self._broadcast(members, group, rank)
        else:
            self._barrier()

    def _reduce(self, group_ranks: list[int], group: object, rank: int, op_name: str,
                master: float, worker: float, expected: float) -> None:
        import procgroup as dist

        op = getattr(dist.reduce_op, op_name)
        for src in group_ranks:
            buf = _array(10, master if rank == src else worker)
            dist.reduce(buf, src, op, group)
            if rank == src:
                np.testing.assert_allclose(buf, _array(10, expected))
        self._barrier()

    def _all_reduce(self, group_ranks: list[int], group: object, rank: int, op_name: str,
                    master: float, worker: float, expected: float) -> None:
        import procgroup as dist

        op = getattr(dist.reduce_op, op_name)
        for src in group_ranks:
            buf = _array(10, master if rank == src else worker)
            dist.all_reduce(buf, op, group)
            np.testing.assert_allclose(buf, _array(10, expected))
        self._barrier()

    # (master value, worker value, expected) per op, for n ranks
    @staticmethod
    def _values(op_name: str, n: int) -> tuple[float, float, float]:
        return {
            "SUM": (2.0, 10.0, 2.0 + 10.0 * (n - 1)),
            "PRODUCT": (2.0, 10.0, 2.0 * 10.0 ** (n - 1)),
            "MIN": (1.0, 1010.0, 1.0),
            "MAX": (10.0, -1.0, 10.0),
        }[op_name]

    def _world_reduce(self, kind: str, op_name: str) -> None:
        import procgroup as dist

        fn = self._reduce if kind == "reduce" else self._all_reduce
        fn(list(range(WORLD)), dist.group.WORLD, dist.get_rank(), op_name, *self._values(op_name, WORLD))

    def _group_reduce(self, kind: str, op_name: str) -> None:
        members, group, rank = _ranks_of_group(__import__("procgroup"))
        if rank not in members:
            self._barrier()
            return
        fn = self._reduce if kind == "reduce" else self._all_reduce
        fn(members, group, rank, op_name, *self._values(op_name, len(members)))

    def test_reduce_sum(self) -> None:
        self._world_reduce("reduce", "SUM")

    def test_reduce_product(self) -> None:
        self._world_reduce("reduce", "PRODUCT")

    def test_reduce_min(self) -> None:
        self._world_reduce("reduce", "MIN")

    def test_reduce_max(self) -> None:
        self._world_reduce("reduce", "MAX")

    def test_reduce_group_sum(self) -> None:
        self._group_reduce("reduce", "SUM")

    def test_reduce_group_product(self) -> None:
        self._group_reduce("reduce", "PRODUCT")

    def test_reduce_group_min(self) -> None:
        self._group_reduce("reduce", "MIN")

    def test_reduce_group_max(self) -> None:
        self._group_reduce("reduce", "MAX")

    def test_all_reduce_sum(self) -> None:
        self._world_reduce("all_reduce", "SUM")

    def test_all_reduce_product(self) -> None:
        self._world_reduce("all_reduce", "PRODUCT")

    def test_all_reduce_min(self) -> None:
        self._world_reduce("all_reduce", "MIN")

    def test_all_reduce_max(self) -> None:
        self._world_reduce("all_reduce", "MAX")

    def test_all_reduce_group_sum(self) -> None:
        self._group_reduce("all_reduce", "SUM")

    def test_all_reduce_group_product(self) -> None:
        self._group_reduce("all_reduce", "PRODUCT")

    def test_all_reduce_group_min(self) -> None:
        self._group_reduce("all_reduce", "MIN")

    def test_all_reduce_group_max(self) -> None:
        self._group_reduce("all_reduce", "MAX")

    def _scatter(self, group_ranks: list[int], group: object, rank: int) -> None:
        import procgroup as dist

        for src in group_ranks:
            out = _array(4, -1)
            if rank == src:
                pieces = [_array(4, i) for i in range(len(group_ranks))]
                dist.scatter(out, src=src, scatter_list=pieces, group=group)
            else:
                dist.scatter(out, src=src, group=group)
            np.testing.assert_array_equal(out, _array(4, group_ranks.index(rank)))
        self._barrier()

    def test_scatter(self) -> None:
        import procgroup as dist

        self._scatter(list(range(WORLD)), dist.group.WORLD, dist.get_rank())

    def test_scatter_group(self) -> None:
        members, group, rank = _ranks_of_group(__import__("procgroup"))
        if rank in members:
            self._scatter(members, group, rank)
        else:
            self._barrier()

    def _gather(self, group_ranks: list[int], group: object, rank: int) -> None:
        import procgroup as dist

        for dst in group_ranks:
            mine = _array(4, rank)
            if rank == dst:
                out = [_array(4, -1) for _ in group_ranks]
                dist.gather(mine, dst=dst, gather_list=out, group=group)
                for r, got in zip(group_ranks, out):
                    np.testing.assert_array_equal(got, _array(4, r))
            else:
                dist.gather(mine, dst=dst, group=group)
        self._barrier()

    def test_gather(self) -> None:
        import procgroup as dist

        self._gather(list(range(WORLD)), dist.group.WORLD, dist.get_rank())

    def test_gather_group(self) -> None:
        members, group, rank = _ranks_of_group(__import__("procgroup"))
        if rank in members:
            self._gather(members, group, rank)
        else:
            self._barrier()

    def _all_gather(self, group_ranks: list[int], group: object, rank: int) -> None:
        import procgroup as dist

        out = [_array(3, -1) for _ in group_ranks]
        dist.all_gather(out, _array(3, rank), group)
        for r, got in zip(group_ranks, out):
            np.testing.assert_array_equal(got, _array(3, r))
        self._barrier()

    def test_all_gather(self) -> None:
        import procgroup as dist

        self._all_gather(list(range(WORLD)), dist.group.WORLD, dist.get_rank())

    def test_all_gather_group(self) -> None:
        members, group, rank = _ranks_of_group(__import__("procgroup"))
        if rank in members:
            self._all_gather(members, group, rank)
        else:
            self._barrier()

    def _barrier_check(self, group_ranks: list[int], group: object, rank: int) -> None:
        """Whoever waits at the barrier sees what each member did before reaching it."""
        import procgroup as dist

        marks = Path(os.environ["TEMP_DIR"], "barrier")
        _BARRIER_CALLS.append(1)  # the same count on every member: they call in the same order
        for src in group_ranks:
            mark = marks / f"{os.getppid()}-{group_ranks}-{len(_BARRIER_CALLS)}-{src}"
            if rank == src:
                time.sleep(0.05)  # arrive last: the others must still be waiting
                mark.write_text("reached")
            dist.barrier(group)
            self.assertTrue(mark.exists(), f"rank {rank} left the barrier before rank {src} reached it")
        dist.barrier(group)

    def test_barrier(self) -> None:
        import procgroup as dist

        self._barrier_check(list(range(WORLD)), None, dist.get_rank())

    def test_barrier_group(self) -> None:
        members, group, rank = _ranks_of_group(__import__("procgroup"))
        if rank in members:
            self._barrier_check(members, group, rank)
        self._barrier()

    def test_reduce_op_names(self) -> None:
        import procgroup as dist

        for name in ("SUM", "PRODUCT", "MIN", "MAX"):
            self.assertIs(getattr(dist.reduce_op, name), getattr(dist.ReduceOp, name))
        self.assertIs(dist.group.WORLD, dist.GroupMember.WORLD)


def _main() -> None:
    """The suite as run_test.sh ran it: see the module docstring."""
    import procgroup as dist

    backend = os.environ["BACKEND"]
    init_method = os.getenv("INIT_METHOD", "env://")
    for sub in ("barrier", "test_dir"):
        os.makedirs(os.path.join(os.environ["TEMP_DIR"], sub), exist_ok=True)

    if backend == "mpi":
        dist.init_process_group(init_method=init_method, backend="mpi")

        class TestMPI(unittest.TestCase, _DistTestBase):
            pass

        suite = unittest.defaultTestLoader.loadTestsFromTestCase(TestMPI)
        result = unittest.TextTestRunner(verbosity=2 if dist.get_rank() == 0 else 0).run(suite)
        print(f"rank {dist.get_rank()}: ran {result.testsRun}, failures {len(result.failures)}, "
              f"errors {len(result.errors)}", flush=True)
        sys.exit(0 if result.wasSuccessful() else 1)

    import multiprocessing

    world_size = os.environ["WORLD_SIZE"]
    join_timeout = float(os.getenv("JOIN_TIMEOUT", "60"))
    ctx = multiprocessing.get_context("fork")

    class TestTCP(unittest.TestCase, _DistTestBase):
        """The manager: each test forks WORLD_SIZE ranks and waits for their exit codes."""

        @classmethod
        def setUpClass(cls) -> None:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ.setdefault("MASTER_PORT", "29500")
            os.environ["WORLD_SIZE"] = world_size

        def run_ranks(self, name: str) -> None:
            procs = []
            for rank in range(int(world_size)):
                os.environ["RANK"] = str(rank)
                p = ctx.Process(target=self._rank_main, args=(name,), name=f"rank {rank}")
                p.start()
                procs.append(p)
            deadline = time.monotonic() + join_timeout
            for p in procs:
                p.join(max(0.1, deadline - time.monotonic()))
            codes = []
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
                    codes.append("hung")
                else:
                    codes.append(p.exitcode)
            self.assertEqual(codes, [0] * len(procs), f"{name}: exit codes of the ranks")

        def _rank_main(self, name: str) -> None:
            dist.init_process_group(init_method=init_method, backend=backend, world_size=int(world_size))
            getattr(self, "_rank_" + name)()  # the check itself (test_* is the manager's)
            sys.exit(0)  # leaves through os._exit: no destroy_process_group, as in 2017

    for attr in list(vars(_DistTestBase)):
        if attr.startswith("test_"):
            def manager(self: TestTCP, _name: str = attr) -> None:
                self.run_ranks(_name)

            manager.__name__ = attr
            setattr(TestTCP, attr, manager)
            setattr(TestTCP, "_rank_" + attr, getattr(_DistTestBase, attr))

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(TestTCP)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


# ------------------------------------------------------------------ the pytest runner
N_TESTS = sum(1 for name in vars(_DistTestBase) if name.startswith("test_"))


def _run_config(backend: str, init: str, tmp: Path) -> str:
    """One configuration of run_test.sh, as a subprocess; returns its output."""
    from procgroup.testing import mpiexec_command
    from procgroup.testing._spawn import free_port

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(BACKEND=backend, TEMP_DIR=str(tmp), PROCGROUP_TIMEOUT="60", PYTHONUNBUFFERED="1")
    if init == "file":
        env["INIT_METHOD"] = f"file://{tmp}/shared_init_file"
    cmd = [sys.executable, os.path.abspath(__file__)]
    if backend == "mpi":
        cmd = mpiexec_command() + ["-n", str(WORLD)] + cmd  # scripts/setup-dev.sh installs mpich
    else:
        env.update(WORLD_SIZE=str(WORLD), MASTER_PORT=str(free_port()))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT, check=False,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{backend}+{init}:// exit {proc.returncode}\n{out[-6000:]}"
    return out


def _config_test(backend: str, init: str):
    def test(tmp_path: Path) -> None:
        import pytest

        if backend == "mpi":
            pytest.importorskip("mpi4py")
        out = _run_config(backend, init, tmp_path)
        assert f"Ran {N_TESTS} tests" in out and "\nOK" in out, out[-3000:]
        if init == "file":
            assert not (tmp_path / "shared_init_file").exists(), "the file should go once every rank read it"

    test.__name__ = f"test_2017_suite_{backend}_{init}"
    test.__doc__ = f"The 2017 suite's checks on {backend} with {init}://, launched as run_test.sh did."
    return test


test_2017_suite_tcp_env = _config_test("tcp", "env")
test_2017_suite_tcp_file = _config_test("tcp", "file")
test_2017_suite_mpi_env = _config_test("mpi", "env")
test_2017_suite_mpi_file = _config_test("mpi", "file")


if __name__ == "__main__" and os.environ.get("BACKEND"):
    _main()
