"""The gloo backend: the conformance suite with 1 to 4 real ranks, plus gloo-specific checks.

Everything runs real processes over real pygloo; the "pygloo missing" case runs a Python
whose import path really lacks pygloo (a copy of the environment's path without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from procgroup.testing import ConformanceSuite, spawn

pytest.importorskip("pygloo", reason="pygloo has wheels only for CPython 3.8-3.10 on x86-64 Linux")

ROOT = Path(__file__).resolve().parents[1]


class TestGlooConformance(ConformanceSuite):
    backend = "gloo"
    world_sizes = (1, 2, 3, 4)


# ------------------------------------------------------------------ one job, many checks
def _gloo_specifics(rank: int, size: int) -> dict[str, Any]:
    """Runs in every rank of a 4-rank job started over tcp:// (a TCPStore in rank 0)."""
    import procgroup as pg
    from procgroup import errors
    from procgroup.ops import ReduceOp

    out: dict[str, Any] = {}
    ch = pg.group_channel()
    out["algorithm"] = str(ch._algorithm)

    # bcube all_reduce (chosen by the environment) on several sizes and dtypes
    for dtype in ("float32", "float64", "int64", "float16"):
        for count in (1, 7, 100_003):
            arr = np.full(count, rank + 1, dtype=dtype)
            pg.all_reduce(arr)
            out[f"sum-{dtype}-{count}"] = bool((arr == size * (size + 1) // 2).all())

    # zero copy: results land in the caller's memory, also through views of one buffer
    whole = np.zeros((size, 1000), dtype=np.int32)
    pg.all_gather(list(whole), np.full(1000, rank, dtype=np.int32))
    out["all_gather_views"] = whole[:, 0].tolist()
    glist = np.zeros((size, 3))
    pg.gather(np.full(3, rank * 2.0), list(glist) if rank == 1 else None, dst=1)
    out["gather_views"] = glist[:, 0].tolist() if rank == 1 else None
    ins = np.arange(size * 5, dtype=np.float64).reshape(size, 5) + rank
    outp = np.zeros(5)
    pg.reduce_scatter(outp, list(ins), op=ReduceOp.MAX)
    out["reduce_scatter_max"] = outp.tolist()

    # ops gloo lacks: int16 bitwise and complex PRODUCT go through the core's algorithms
    b = np.full(4, 1 << rank, dtype=np.int16)
    pg.all_reduce(b, op=ReduceOp.BOR)
    out["int16_bor"] = int(b[0])
    c = np.full(2, 1j, dtype=np.complex128)
    pg.all_reduce(c, op=ReduceOp.PRODUCT)
    out["complex_product"] = complex(c[0])

    # the full user tag range on the side channel, any source
    if rank == 0:
        srcs = sorted(pg.recv(np.zeros(2), tag=2**31 - 1) for _ in range(size - 1))
        out["any_source_max_tag"] = srcs
    else:
        pg.send(np.full(2, float(rank)), 0, tag=2**31 - 1)

    # a group without world rank 0 (it serves the TCPStore): rank 0 goes straight into a
    # world collective, blocking in gloo with the GIL held, while the members rendezvous
    g = pg.new_group(list(range(1, size)))
    total = np.full(3, rank, dtype=np.int64)
    if rank != 0:
        pg.all_reduce(total, group=g)
        out["group_without_0"] = int(total[0])
    world = np.ones(2)
    pg.all_reduce(world)
    out["world_after_group"] = float(world[0])

    # bad input still fails before anything is sent
    try:
        pg.all_reduce(np.zeros(2, dtype=np.float32), op=ReduceOp.BXOR)
    except errors.UnsupportedOperationError as exc:
        out["bxor_float"] = str(exc)
    pg.barrier()
    return out


def test_gloo_specifics_over_tcp_store() -> None:
    size = 4
    results = spawn(_gloo_specifics, size, "gloo", init_method="tcp", timeout=60.0,
                    env={"PROCGROUP_GLOO_ALGORITHM": "bcube"}, job_timeout=240.0)
    for rank, res in enumerate(results):
        assert res["algorithm"].endswith("BCUBE"), res["algorithm"]
        bad = [k for k, v in res.items() if k.startswith("sum-") and v is not True]
        assert not bad, f"rank {rank}: wrong all_reduce results for {bad}"
        assert res["all_gather_views"] == list(range(size))
        want_max = [float(j * 5 + i + size - 1) for j in [rank] for i in range(5)]
        assert res["reduce_scatter_max"] == want_max, (rank, res["reduce_scatter_max"])
        assert res["int16_bor"] == (1 << size) - 1
        assert res["complex_product"] == 1j ** size
        assert res["world_after_group"] == float(size)
        assert "BXOR" in res["bxor_float"]
        if rank != 0:
            assert res["group_without_0"] == sum(range(1, size))
    assert results[1]["gather_views"] == [0.0, 2.0, 4.0, 6.0]
    assert results[0]["any_source_max_tag"] == list(range(1, size))


def _env_init(rank: int, size: int) -> list[float]:
    """env:// (MASTER_ADDR/PORT, TCPStore) then a broadcast and an all_reduce."""
    import procgroup as pg

    arr = np.full(5, float(rank))
    pg.broadcast(arr, size - 1)
    pg.all_reduce(arr)
    return arr.tolist()


def test_env_init_method() -> None:
    from procgroup.testing._spawn import free_port

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    results = spawn(_env_init, 3, "gloo", init_method="env://", env=env, timeout=60.0, job_timeout=120.0)
    assert results == [[6.0] * 5] * 3


# ------------------------------------------------------------------ settings
def test_algorithm_and_arrival_settings() -> None:
    import pygloo
    from procgroup.errors import InvalidArgumentError
    from procgroup_gloo import _options

    assert _options.allreduce_algorithm({"algorithm": "bcube"}) == pygloo.allreduceAlgorithm.BCUBE
    assert _options.allreduce_algorithm({}) == pygloo.allreduceAlgorithm.RING
    with pytest.raises(InvalidArgumentError, match="gloo all_reduce algorithm.*ring, bcube"):
        _options.allreduce_algorithm({"algorithm": "tree"})
    assert _options.arrival_check({}, 5.0) is True  # shorter than gloo's fixed 30 s
    assert _options.arrival_check({}, 300.0) is False
    assert _options.arrival_check({"arrival_check": "always"}, 300.0) is True
    with pytest.raises(InvalidArgumentError, match="gloo arrival check.*auto, always, never"):
        _options.arrival_check({"arrival_check": "sometimes"}, 5.0)


def test_info_lists_gloo_native() -> None:
    proc = subprocess.run([sys.executable, "-m", "procgroup", "info"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    gloo_line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("gloo "))
    assert "available" in gloo_line and "unavailable" not in gloo_line, gloo_line
    all_reduce = next(line for line in proc.stdout.splitlines() if line.strip().startswith("all_reduce"))
    assert all_reduce.split()[1] == "native", all_reduce


# ------------------------------------------------------------------ pygloo missing
def _path_without_pygloo(tmp_path: Path) -> str:
    """A directory mirroring this environment's import path, minus pygloo."""
    import pygloo

    site = Path(pygloo.__file__).resolve().parent
    mirror = tmp_path / "site"
    mirror.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith("pygloo"):
            (mirror / entry.name).symlink_to(entry)
    # -S skips .pth files, so the editable installs' source folders go on the path directly
    return os.pathsep.join([str(mirror), str(ROOT / "core"), str(ROOT / "backends" / "tcp"),
                            str(ROOT / "backends" / "gloo")])


def test_unavailable_without_pygloo(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=_path_without_pygloo(tmp_path))
    script = (
        "import importlib.util, procgroup as pg\n"
        "from procgroup.errors import BackendUnavailableError\n"
        "assert importlib.util.find_spec('pygloo') is None\n"
        "try:\n"
        "    pg.init_process_group('gloo', 'file://" + str(tmp_path / "rdv") + "', rank=0, world_size=1)\n"
        "except BackendUnavailableError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR backend 'gloo' is installed but cannot run here" in proc.stdout, proc.stdout
    assert "pygloo is not installed" in proc.stdout and "CPython 3.8-3.10 on x86-64 Linux" in proc.stdout
    info = subprocess.run([sys.executable, "-S", "-m", "procgroup", "info"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert info.returncode == 0, info.stderr
    line = next(ln for ln in info.stdout.splitlines() if ln.strip().startswith("gloo "))
    assert "unavailable: pygloo is not installed" in line, line
