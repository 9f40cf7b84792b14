"""The gloo backend on each engine (pygloo, torch): the conformance suite with 1 to 4 real
ranks, plus gloo-specific checks.

Everything runs real processes over real gloo (pygloo, or torch.distributed's
ProcessGroupGloo). An engine that is not installed here skips its tests with the reason
(pygloo has wheels for CPython 3.8-3.10 only; torch is the extra procgroup-gloo[torch]).
The "engine missing" cases run a Python whose import path really lacks it (a copy of
the environment's path without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _installed import why_no_gloo_engine
from procgroup.testing import ConformanceSuite, spawn

ROOT = Path(__file__).resolve().parents[1]

WHY_MISSING = {name: why_no_gloo_engine(name) for name in ("pygloo", "torch")}  # None: installed
HAVE = {name: why is None for name, why in WHY_MISSING.items()}


def needs(engine: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not HAVE[engine], reason=f"gloo engine {engine}: {WHY_MISSING[engine]}")


ENGINES = [pytest.param(name, marks=needs(name)) for name in ("pygloo", "torch")]


def engine_env(engine: str) -> dict[str, str]:
    return {"PROCGROUP_GLOO_ENGINE": engine}


@needs("pygloo")
class TestGlooConformancePygloo(ConformanceSuite):
    backend = "gloo"
    world_sizes = (1, 2, 3, 4)
    env = engine_env("pygloo")


@needs("torch")
class TestGlooConformanceTorch(ConformanceSuite):
    backend = "gloo"
    world_sizes = (1, 2, 3, 4)
    env = engine_env("torch")


# ------------------------------------------------------------------ one job, many checks
def _gloo_specifics(rank: int, size: int) -> dict[str, Any]:
    """Runs in every rank of a 4-rank job started over tcp:// (a TCPStore in rank 0)."""
    import procgroup as pg
    from procgroup import errors
    from procgroup.ops import ReduceOp

    out: dict[str, Any] = {}
    ch = pg.group_channel()
    out["engine"] = ch.engine
    out["algorithm"] = ch._algorithm

    # all_reduce (bcube on pygloo, chosen by the environment) on several sizes and dtypes
    for dtype in ("float32", "float64", "int64", "float16", "uint32", "int8"):
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

    # ops gloo lacks: int16 bitwise and complex PRODUCT go through the core's algorithms;
    # on torch, uint64 MAX (no unsigned types there) and uint32 SUM as int32 bits
    b = np.full(4, 1 << rank, dtype=np.int16)
    pg.all_reduce(b, op=ReduceOp.BOR)
    out["int16_bor"] = int(b[0])
    c = np.full(2, 1j, dtype=np.complex128)
    pg.all_reduce(c, op=ReduceOp.PRODUCT)
    out["complex_product"] = complex(c[0])
    big = np.full(3, 2**64 - 1 - rank, dtype=np.uint64)
    pg.all_reduce(big, op=ReduceOp.MIN)
    out["uint64_min"] = int(big[0])
    wrap = np.full(3, 2**31 + rank, dtype=np.uint32)
    pg.all_reduce(wrap)
    out["uint32_wrap"] = int(wrap[0])
    xor = np.full(5, rank + 1, dtype=np.int32)
    pg.all_reduce(xor, op=ReduceOp.BXOR)
    out["int32_bxor"] = int(xor[0])
    keep = np.arange(6, dtype=np.float32) + rank
    pg.reduce(keep, dst=0)
    out["reduce_keeps_nonroot"] = keep.tolist()

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


@pytest.mark.parametrize("engine", ENGINES)
def test_gloo_specifics_over_tcp_store(engine: str) -> None:
    size = 4
    algorithm = "bcube" if engine == "pygloo" else "ring"  # torch's ProcessGroupGloo has ring only
    results = spawn(_gloo_specifics, size, "gloo", init_method="tcp", timeout=60.0,
                    env={"PROCGROUP_GLOO_ALGORITHM": algorithm, **engine_env(engine)}, job_timeout=240.0)
    for rank, res in enumerate(results):
        assert res["engine"] == engine
        assert res["algorithm"] == algorithm, res["algorithm"]
        bad = [k for k, v in res.items() if k.startswith("sum-") and v is not True]
        assert not bad, f"rank {rank}: wrong all_reduce results for {bad}"
        assert res["all_gather_views"] == list(range(size))
        want_max = [float(j * 5 + i + size - 1) for j in [rank] for i in range(5)]
        assert res["reduce_scatter_max"] == want_max, (rank, res["reduce_scatter_max"])
        assert res["int16_bor"] == (1 << size) - 1
        assert res["complex_product"] == 1j ** size
        assert res["world_after_group"] == float(size)
        assert "BXOR" in res["bxor_float"]
        assert res["uint64_min"] == 2**64 - size
        assert res["uint32_wrap"] == (size * 2**31 + sum(range(size))) % 2**32
        want_xor = 0
        for r in range(size):
            want_xor ^= r + 1
        assert res["int32_bxor"] == want_xor
        want_reduce = [float(sum(i + r for r in range(size))) for i in range(6)] if rank == 0 else \
            [float(i + rank) for i in range(6)]
        assert res["reduce_keeps_nonroot"] == want_reduce, (rank, res["reduce_keeps_nonroot"])
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


@pytest.mark.parametrize("engine", ENGINES)
def test_env_init_method(engine: str) -> None:
    from procgroup.testing._spawn import free_port

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **engine_env(engine)}
    results = spawn(_env_init, 3, "gloo", init_method="env://", env=env, timeout=60.0, job_timeout=120.0)
    assert results == [[6.0] * 5] * 3


# ------------------------------------------------------------------ settings
def test_settings() -> None:
    """Options and environment variables, parsed without importing pygloo or torch."""
    from procgroup.errors import InvalidArgumentError
    from procgroup_gloo import _engine, _options

    assert _options.allreduce_algorithm({"algorithm": "bcube"}) == "bcube"
    assert _options.allreduce_algorithm({}) == "ring"
    with pytest.raises(InvalidArgumentError, match="gloo all_reduce algorithm.*ring, bcube"):
        _options.allreduce_algorithm({"algorithm": "tree"})
    assert _options.arrival_check({}, 5.0) is True  # shorter than pygloo's fixed 30 s
    assert _options.arrival_check({}, 300.0) is False
    assert _options.arrival_check({"arrival_check": "always"}, 300.0) is True
    with pytest.raises(InvalidArgumentError, match="gloo arrival check.*auto, always, never"):
        _options.arrival_check({"arrival_check": "sometimes"}, 5.0)
    with pytest.raises(InvalidArgumentError, match="gloo engine.*auto, pygloo, torch"):
        _options.engine({"engine": "mpi"})
    # auto: pygloo when importable, else torch; an engine asked for must be installed
    name, why = _engine.resolve({})
    want = "pygloo" if HAVE["pygloo"] else "torch" if HAVE["torch"] else None
    assert name == want, (name, why)
    for engine in ("pygloo", "torch"):
        name, why = _engine.resolve({"engine": engine})
        assert name == (engine if HAVE[engine] else None), (engine, name, why)
        assert why.startswith(f"option engine={engine}"), why
        if not HAVE[engine]:
            assert WHY_MISSING[engine].split(" (")[0] in why or "pip install" in why, why


@pytest.mark.parametrize("engine", ENGINES)
def test_info_names_the_engine(engine: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "procgroup", "info"], capture_output=True, text=True, timeout=120,
                          check=False, env=dict(os.environ, **engine_env(engine)))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("gloo "))
    assert "available" in lines[at] and "unavailable" not in lines[at], lines[at]
    assert lines[at + 1].strip().startswith(f"engine {engine} "), lines[at + 1]
    assert "PROCGROUP_GLOO_ENGINE" in lines[at + 1], lines[at + 1]
    other = "torch" if engine == "pygloo" else "pygloo"
    assert f"{other} unavailable" in lines[at + 1] or f"{other} " in lines[at + 1], lines[at + 1]
    all_reduce = next(line for line in lines if line.strip().startswith("all_reduce"))
    assert all_reduce.split()[1] == "native", all_reduce


def _bcube_on_torch(rank: int, size: int) -> str:
    import procgroup as pg
    from procgroup.errors import InvalidArgumentError

    try:
        pg.init_process_group("gloo", os.environ["PG_URL"], rank=rank, world_size=size, timeout=30)
    except InvalidArgumentError as exc:
        return str(exc)
    pg.destroy_process_group()
    return "no error"


@needs("torch")
def test_bcube_needs_pygloo(tmp_path: Path) -> None:
    """torch's ProcessGroupGloo runs ring only: bcube is a clear error, not a silent ring."""
    results = spawn(_bcube_on_torch, 2, "gloo", init=False, timeout=30.0, job_timeout=120.0,
                    env={"PROCGROUP_GLOO_ALGORITHM": "bcube", "PG_URL": f"file://{tmp_path}/rdv",
                         **engine_env("torch")})
    for msg in results:
        assert "bcube" in msg and "needs the pygloo engine" in msg, msg


def _gloo_times_out(rank: int, size: int) -> dict[str, Any]:
    """Rank 1 never joins; with no arrival check gloo's own timeout (procgroup's) must fire."""
    import time

    import procgroup as pg
    from procgroup.errors import CommTimeoutError

    out: dict[str, Any] = {"error": None}
    if rank == 0:
        start = time.monotonic()
        try:
            pg.all_reduce(np.ones(8))
        except CommTimeoutError as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        out["seconds"] = time.monotonic() - start
    else:
        time.sleep(8.0)
    return out


@needs("torch")
def test_torch_gloo_timeout_is_procgroups() -> None:
    results = spawn(_gloo_times_out, 2, "gloo", timeout=2.0, job_timeout=90.0,
                    env={"PROCGROUP_GLOO_ARRIVAL_CHECK": "never", **engine_env("torch")})
    res = results[0]
    assert res["error"] == "CommTimeoutError", res
    assert "all_reduce" in res["message"] and "timeout of 2s" in res["message"], res
    assert res["seconds"] < 8.0, f"gloo waited past the channel's 2 s timeout: {res}"


@pytest.mark.skipif(not (HAVE["pygloo"] and HAVE["torch"]),
                    reason="needs pygloo and torch in one environment (pygloo has wheels for CPython 3.8-3.10 only)")
def test_ranks_on_different_engines_get_a_clear_error(tmp_path: Path) -> None:
    results = spawn(_mixed_engines, 2, "gloo", init=False, timeout=20.0, job_timeout=120.0,
                    env={"PG_URL": f"file://{tmp_path}/rdv"})
    for msg in results:
        assert "every rank must use the same engine" in msg, msg


def _mixed_engines(rank: int, size: int) -> str:
    import procgroup as pg
    from procgroup.errors import InvalidArgumentError

    os.environ["PROCGROUP_GLOO_ENGINE"] = ("pygloo", "torch")[rank]
    try:
        pg.init_process_group("gloo", os.environ["PG_URL"], rank=rank, world_size=size, timeout=20)
    except InvalidArgumentError as exc:
        return str(exc)
    pg.destroy_process_group()
    return "no error"


# ------------------------------------------------------------------ an engine missing
def _path_without(tmp_path: Path, hidden: tuple[str, ...]) -> str:
    """A directory mirroring this environment's site-packages, minus ``hidden`` packages."""
    site = Path(np.__file__).resolve().parents[1]
    mirror = tmp_path / "site"
    mirror.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(hidden):
            (mirror / entry.name).symlink_to(entry)
    # -S skips .pth files, so the editable installs' source folders go on the path directly
    return os.pathsep.join([str(mirror), str(ROOT / "core"), str(ROOT / "backends" / "tcp"),
                            str(ROOT / "backends" / "gloo")])


def _init_alone(tmp_path: Path) -> str:
    return (
        "import procgroup as pg\n"
        "from procgroup.errors import BackendUnavailableError\n"
        "try:\n"
        "    pg.init_process_group('gloo', 'file://" + str(tmp_path / "rdv") + "', rank=0, world_size=1)\n"
        "    print('ENGINE', pg.group_channel().engine)\n"
        "except BackendUnavailableError as exc:\n"
        "    print('ERROR', exc)\n"
    )


def _gloo_line(env: dict[str, str]) -> list[str]:
    info = subprocess.run([sys.executable, "-S", "-m", "procgroup", "info"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("gloo "))
    return lines[at:at + 2]


def test_unavailable_without_any_engine(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=_path_without(tmp_path, ("pygloo", "torch")))
    env.pop("PROCGROUP_GLOO_ENGINE", None)
    proc = subprocess.run([sys.executable, "-S", "-c", _init_alone(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "ERROR backend 'gloo' is installed but cannot run here" in proc.stdout, proc.stdout
    assert "pygloo is not installed" in proc.stdout and "CPython 3.8-3.10 on x86-64 Linux" in proc.stdout
    assert "pip install procgroup-gloo[torch]" in proc.stdout, proc.stdout
    line = _gloo_line(env)[0]
    assert "unavailable: pygloo is not installed" in line and "procgroup-gloo[torch]" in line, line


@needs("torch")
def test_torch_engine_where_pygloo_is_missing(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=_path_without(tmp_path, ("pygloo",)))
    env.pop("PROCGROUP_GLOO_ENGINE", None)
    proc = subprocess.run([sys.executable, "-S", "-c", _init_alone(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "ENGINE torch" in proc.stdout, proc.stdout
    line, detail = _gloo_line(env)
    assert "unavailable" not in line, line
    assert detail.strip().startswith("engine torch ") and "pygloo unavailable: pygloo is not installed" in detail
    # asking for pygloo there is the same clear error as having no engine
    env["PROCGROUP_GLOO_ENGINE"] = "pygloo"
    (tmp_path / "again").mkdir()
    proc = subprocess.run([sys.executable, "-S", "-c", _init_alone(tmp_path / "again")], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert "ERROR backend 'gloo' is installed but cannot run here" in proc.stdout, proc.stdout
    assert "$PROCGROUP_GLOO_ENGINE=pygloo, but pygloo is not installed" in proc.stdout, proc.stdout
