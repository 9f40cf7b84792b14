"""torchrun as a launcher: procgroup scripts run under it unchanged (env://, restarts).

torchrun's workers find MASTER_ADDR:MASTER_PORT already taken by the agent's own store
(TORCHELASTIC_USE_AGENT_STORE=True); env:// passes rank 0's store address through it
(rendezvous/_torchelastic.py). These tests run the torchrun of the torch installed in the
venv, as a user types it (docs/launcher.md, "On a cluster"), and skip where torch is absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)

JOB = '''
import json, os, socket, sys
import numpy as np
import procgroup as pg

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
pg.init_process_group("tcp")
rank, size = pg.get_rank(), pg.get_world_size()
if attempt == 0 and os.environ.get("FAIL_RANK") == str(rank):
    pg.barrier()
    sys.exit(7)  # the first attempt fails; torchrun --max-restarts starts every rank again
x = np.array([rank + 1.0])
pg.all_reduce(x)
hosts = [None] * size
pg.all_gather_object(hosts, os.environ["LOCAL_RANK"])
print("RESULT " + json.dumps({
    "rank": rank, "size": size, "sum": float(x[0]), "attempt": attempt, "local_ranks": hosts,
    "launched": pg.is_torchelastic_launched(), "node_local_rank": pg.get_node_local_rank(),
    "run_id": os.environ["TORCHELASTIC_RUN_ID"], "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
}), flush=True)
pg.destroy_process_group()
'''


def _torchrun() -> str:
    pytest.importorskip("torch.distributed.run", reason="torch is not installed in this venv")
    path = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(path):
        path = shutil.which("torchrun") or ""
    if not path:
        pytest.skip("torch is installed but its torchrun script is not")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("torchrun") / "job.py"
    path.write_text(textwrap.dedent(JOB))
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC", "PROCGROUP_", "SLURM_", "PMI_", "OMPI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra)
    return env


def _results(stdout: str) -> list[dict[str, Any]]:
    # two workers of one agent may share a line of torchrun's output: find each object
    recs = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", stdout)]
    return sorted(recs, key=lambda r: r["rank"])


def test_standalone_with_a_restart(job: Path) -> None:
    """`torchrun --standalone --nproc-per-node 2 --max-restarts 1 job.py`: rank 1 fails the
    first attempt, torchrun restarts both, the second attempt meets and finishes."""
    done = subprocess.run(
        [_torchrun(), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(job)],
        env=_env(FAIL_RANK="1"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    recs = _results(done.stdout)
    assert [r["rank"] for r in recs] == [0, 1], done.stdout + done.stderr
    for r in recs:
        assert r["size"] == 2 and r["sum"] == 3.0 and r["attempt"] == 1, r
        assert r["launched"] is True and r["node_local_rank"] == r["rank"], r
        assert r["local_ranks"] == ["0", "1"] and r["agent_store"] == "True", r


def test_two_nodes_static_rendezvous(job: Path) -> None:
    """Two torchrun agents, as on two nodes: `torchrun --nnodes 2 --node-rank K
    --master-addr 127.0.0.1 --master-port P --nproc-per-node 2 job.py` (every worker imports
    torch to reach the agent's store: this is the slowest test here, a minute on 2 busy cores)."""
    port = str(_free_port())
    procs = [subprocess.Popen(
        [_torchrun(), "--nnodes", "2", "--node-rank", str(k), "--master-addr", "127.0.0.1",
         "--master-port", port, "--nproc-per-node", "2", str(job)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out, err in outs:
        assert rc == 0, out + err
    recs = _results(outs[0][1] + outs[1][1])
    assert [r["rank"] for r in recs] == [0, 1, 2, 3], outs
    for r in recs:
        assert r["size"] == 4 and r["sum"] == 10.0 and r["attempt"] == 0, r
        assert r["local_ranks"] == ["0", "1", "0", "1"], r  # node by node
        assert r["node_local_rank"] == r["rank"] % 2, r
