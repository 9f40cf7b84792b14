"""Master-worker mode (issue 16) with real processes: tcp (everything), mpi under mpiexec
and gloo (a smaller matrix), procgroup-run, and how workers end.

Each job starts its ranks once and runs many checks (tests/mw_checks.py prints one JSON
line of results on the master); the tests here read the results of one shared job.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _installed import require_gloo
from _mw_run import MARK
from procgroup.testing._spawn import free_port, mpiexec_command

HERE = Path(__file__).parent
CHECKS = HERE / "mw_checks.py"
JOB_TIMEOUT = 240.0

ALL_CHECKS = ["issue_example", "constructors", "operators", "ufuncs_and_functions", "methods", "indexing",
              "numpy_errors_at_the_call", "sync_points", "remote_errors", "gc_frees_remote_memory",
              "streams_and_events", "to_between_nodes", "copy_failures", "across_nodes", "cuda"]
#: what the mpi and gloo jobs run: the families that touch the transport
SMALL_CHECKS = ["issue_example", "operators", "sync_points", "remote_errors", "gc_frees_remote_memory",
                "streams_and_events", "to_between_nodes", "copy_failures", "across_nodes", "cuda"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PROCGROUP_BACKEND", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PROCGROUP_TIMEOUT", "60")
    env.update(extra)
    return env


def launch(script: Path, world: int, args: list[str] = (), env: dict[str, str] | None = None,
           timeout: float = JOB_TIMEOUT) -> list[tuple[int, str, str]]:
    """Start ``world`` ranks of ``script`` over env:// on this host; (exit, stdout, stderr) per rank."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                 MW_NODES=str(world - 1), **(env or {}))
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL))
    out = []
    try:
        for p in procs:
            so, se = p.communicate(timeout=timeout)
            out.append((p.returncode, so, se))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def results_of(stdout: str, stderr: str = "") -> dict[str, str | None]:
    """The master's MW-RESULTS line (tests/_mw_run.py): check name -> None or traceback."""
    for line in stdout.splitlines():
        if MARK in line:
            return json.loads(line.split(MARK, 1)[1])
    raise AssertionError(f"the master printed no results:\n{stdout[-3000:]}\n{stderr[-3000:]}")


def _assert_clean(ranks: list[tuple[int, str, str]]) -> None:
    for r, (code, so, se) in enumerate(ranks):
        assert code == 0, f"rank {r} exited with {code}:\n{so[-2000:]}\n{se[-3000:]}"


# --------------------------------------------------------------------- tcp: every family
@pytest.fixture(scope="module")
def tcp_job() -> dict[str, str | None]:
    ranks = launch(CHECKS, 4, env={"MW_BACKEND": "tcp"})  # a master and 3 nodes
    _assert_clean(ranks)
    return results_of(ranks[0][1], ranks[0][2])


@pytest.mark.parametrize("check", ALL_CHECKS)
def test_tcp(tcp_job: dict[str, str | None], check: str) -> None:
    assert check in tcp_job, f"{check} did not run"
    assert tcp_job[check] is None, tcp_job[check]


# --------------------------------------------------------------------- mpi and gloo
@pytest.fixture(scope="module")
def mpi_job() -> dict[str, str | None]:
    # the test setup installs procgroup-mpi[mpich] (mpi4py and mpiexec) on every leg
    assert importlib.util.find_spec("mpi4py") is not None, "scripts/setup-dev.sh installs procgroup-mpi[mpich]"
    cmd = mpiexec_command()
    env = _env(MW_BACKEND="mpi", MW_NODES="2")
    for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        env.pop(k, None)
    proc = subprocess.run(cmd + ["-n", "3", sys.executable, str(CHECKS), *SMALL_CHECKS], check=False, env=env,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"mpiexec exited with {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return results_of(proc.stdout, proc.stderr)


@pytest.mark.parametrize("check", SMALL_CHECKS)
def test_mpi(mpi_job: dict[str, str | None], check: str) -> None:
    assert mpi_job[check] is None, mpi_job[check]


@pytest.fixture(scope="module")
def gloo_job() -> dict[str, str | None]:
    require_gloo()
    ranks = launch(CHECKS, 3, SMALL_CHECKS, env={"MW_BACKEND": "gloo"})
    _assert_clean(ranks)
    return results_of(ranks[0][1], ranks[0][2])


@pytest.mark.parametrize("check", SMALL_CHECKS)
def test_gloo(gloo_job: dict[str, str | None], check: str) -> None:
    assert gloo_job[check] is None, gloo_job[check]


# --------------------------------------------------------------------- procgroup-run
def test_procgroup_run_gives_a_master_and_two_nodes(tmp_path: Path) -> None:
    run = Path(sys.executable).with_name("procgroup-run")
    assert run.exists(), "the procgroup distribution installs the procgroup-run console script"
    proc = subprocess.run([str(run), "--nproc-per-node", "3", str(CHECKS), "issue_example", "to_between_nodes",
                           "across_nodes", "remote_errors"], check=False, env=_env(MW_NODES="2"), capture_output=True,
                          text=True, timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = results_of(proc.stdout, proc.stderr)
    assert all(v is None for v in results.values()), results


# --------------------------------------------------------------------- how workers end
ENDINGS = textwrap.dedent("""
    import os, sys, time, numpy as np, procgroup as pg
    pg.init_master_worker("tcp")
    print("MASTER-ONLY", flush=True)   # never printed by a worker: the call does not return there
    x = pg.remote.ones(1000)
    y = (x * 2).sum()
    assert float(y) == 2000.0
    mode = sys.argv[1]
    if mode == "destroy":
        pg.destroy_process_group()
        print("after destroy", flush=True)
    elif mode == "die":
        os.kill(os.getpid(), 9)
    elif mode == "raise":
        raise RuntimeError("the master's own bug")
    # "exit": just end the script
""")


@pytest.fixture(scope="module")
def endings_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mw") / "endings.py"
    path.write_text(ENDINGS)
    return path


@pytest.mark.parametrize("mode", ["exit", "destroy", "raise"])
def test_workers_end_cleanly_with_the_master(endings_script: Path, mode: str) -> None:
    ranks = launch(endings_script, 3, [mode], timeout=90)
    master_code, master_out, master_err = ranks[0]
    assert master_out.count("MASTER-ONLY") == 1
    assert master_code == (1 if mode == "raise" else 0), master_err[-2000:]
    for r, (code, so, se) in enumerate(ranks[1:], 1):
        assert code == 0, f"rank {r} ({mode}) exited with {code}: {se[-2000:]}"
        assert "MASTER-ONLY" not in so


def test_workers_end_with_an_error_when_the_master_dies(endings_script: Path) -> None:
    ranks = launch(endings_script, 3, ["die"], timeout=90)
    assert ranks[0][0] == -signal.SIGKILL
    for r, (code, _so, se) in enumerate(ranks[1:], 1):
        assert code != 0, f"rank {r} exited 0 after the master died"
        assert "the master (rank 0)" in se and f"node {r - 1}" in se, se[-2000:]


def test_init_master_worker_on_a_world_of_one_has_no_nodes(tmp_path: Path) -> None:
    script = tmp_path / "alone.py"
    script.write_text(textwrap.dedent("""
        import procgroup as pg
        pg.init_master_worker("tcp")
        assert pg.num_nodes() == 0
        try:
            pg.remote.zeros(3)
        except pg.InvalidArgumentError as exc:
            assert "node 0 does not exist" in str(exc), exc
        else:
            raise AssertionError("an array on no node")
        pg.destroy_process_group()
        try:
            pg.remote.zeros(3)
        except pg.ProcGroupError as exc:
            assert "init_master_worker" in str(exc)
        print("OK")
    """))
    (code, out, err), = launch(script, 1, timeout=60)
    assert code == 0 and "OK" in out, err[-2000:]
