"""procgroup.utils.comm in a real 4-rank tcp job: two procgroup-run launchers on 127.0.0.1
acting as two nodes (--nnodes 2 --node-rank 0/1, 2 ranks each), so local groups are real.

One job runs every check; each rank prints its observations as JSON and the test compares
them with values computed here from the rank numbers.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(300)

WORLD, PER_NODE = 4, 2

WORKER = r'''
import json, os, sys
import numpy as np
import procgroup as pg
from procgroup.errors import InvalidArgumentError, InvalidArrayError, NotInitializedError
from procgroup.utils import comm

out = {}

def raises(exc_type, fn, *args):
    try:
        fn(*args)
    except exc_type as e:
        return type(e).__name__
    return "no error"

# ---- before init: a world of one
out["pre"] = {
    "world": comm.get_world_size(), "rank": comm.get_rank(), "main": comm.is_main_process(),
    "local_rank": comm.get_local_rank(), "local_size": comm.get_local_size(),
    "sync": comm.synchronize(), "all_gather": comm.all_gather("x"), "gather": comm.gather("x"),
    "reduce_dict": {k: float(v) for k, v in comm.reduce_dict({"a": 1.5}).items()},
    "seed_type": type(comm.shared_random_seed()).__name__,
    "no_local_group": raises(NotInitializedError, comm.get_local_process_group),
    "create_before_init": raises(NotInitializedError, comm.create_local_process_group, 2),
}

pg.init_process_group(timeout=60)  # env:// + PROCGROUP_BACKEND from procgroup-run
rank = pg.get_rank()
out["auto_local_group"] = isinstance(comm.get_local_process_group(), pg.Group)  # made by init_process_group
comm.maybe_create_local_group_from_env()  # idempotent (collective-safe no-op if made)
comm.create_local_process_group(2)        # same size again: no-op
out["rank"] = rank
out["world"] = comm.get_world_size()
out["comm_rank"] = comm.get_rank()
out["main"] = comm.is_main_process()
out["local_rank"] = comm.get_local_rank()
out["local_size"] = comm.get_local_size()
out["bad_local_size"] = raises(InvalidArgumentError, comm.create_local_process_group, 4)
out["bad_divisor"] = raises(InvalidArgumentError, comm.create_local_process_group, 3)
out["bad_type"] = raises(InvalidArgumentError, comm.create_local_process_group, "2")

local = comm.get_local_process_group()
a = np.array([float(rank)])
pg.all_reduce(a, group=local)
out["local_sum"] = float(a[0])
comm.synchronize()

out["all_gather"] = comm.all_gather({"rank": rank, "sq": rank * rank})
out["all_gather_local"] = comm.all_gather(rank, group=local)
out["gather0"] = comm.gather(rank * 10)
out["gather3"] = comm.gather(f"r{rank}", dst=3)
node_first = (rank // 2) * 2  # the global rank that leads this rank's local group
out["gather_local"] = comm.gather(rank, dst=node_first, group=local)

np.random.seed(rank)  # different generator state per rank
out["seed"] = comm.shared_random_seed()

keys = ["loss", "acc", "n"] if rank % 2 else ["n", "acc", "loss"]  # insertion order varies
vals = {"loss": np.float32(rank), "acc": rank * 2, "n": np.array(1.0)}
avg = comm.reduce_dict({k: vals[k] for k in keys})
summed = comm.reduce_dict({k: vals[k] for k in keys}, average=False)
out["reduce_avg_keys"] = sorted(avg)
out["reduce_sum_keys"] = sorted(summed)
if rank == 0:
    out["reduce_avg"] = {k: float(v) for k, v in avg.items()}
    out["reduce_sum"] = {k: float(v) for k, v in summed.items()}
    out["reduce_sum_acc_dtype"] = str(np.asarray(summed["acc"]).dtype)
# ranks pass different number types for one key: still one well-defined sum
mixed = comm.reduce_dict({"x": np.float32(0.5) if rank % 2 else 1}, average=False)
if rank == 0:
    out["reduce_mixed"] = float(mixed["x"])
out["reduce_bad_shape"] = raises(InvalidArrayError, comm.reduce_dict, {"a": np.zeros(2), "b": 1.0})
out["reduce_bad_type"] = raises(InvalidArrayError, comm.reduce_dict, {"a": "text"})
comm.synchronize()

pg.destroy_process_group()
out["post"] = {"world": comm.get_world_size(), "rank": comm.get_rank(),
               "local_rank": comm.get_local_rank(), "local_size": comm.get_local_size()}
print("RESULT " + json.dumps(out), flush=True)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """Run the 2-node x 2-rank job once; per-rank observations by rank."""
    d = tmp_path_factory.mktemp("comm")
    script = d / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "procgroup.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", str(PER_NODE), "--master-port", port, "--backend", "tcp",
             "--timeout", "150", "--grace-period", "2", str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for node in (0, 1)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=200))
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    found: dict[int, dict[str, Any]] = {}
    for out, _ in outs:
        for line in out.splitlines():
            if "RESULT " in line:
                r = json.loads(line.split("RESULT ", 1)[1])
                found[r["rank"]] = r
    assert sorted(found) == list(range(WORLD))
    return found


def test_before_init_is_a_world_of_one(results: dict[int, dict[str, Any]]) -> None:
    for r in results.values():
        assert r["pre"] == {
            "world": 1, "rank": 0, "main": True, "local_rank": 0, "local_size": 1,
            "sync": None, "all_gather": ["x"], "gather": ["x"], "reduce_dict": {"a": 1.5},
            "seed_type": "int", "no_local_group": "NotInitializedError",
            "create_before_init": "NotInitializedError",
        }


def test_ranks_and_local_groups(results: dict[int, dict[str, Any]]) -> None:
    for rank, r in results.items():
        assert r["world"] == WORLD
        assert r["comm_rank"] == rank
        assert r["main"] is (rank == 0)
        assert r["local_rank"] == rank % PER_NODE
        assert r["local_size"] == PER_NODE
        node = rank // PER_NODE
        assert r["local_sum"] == float(sum(range(node * PER_NODE, (node + 1) * PER_NODE)))
        assert r["bad_local_size"] == "InvalidArgumentError"
        assert r["bad_divisor"] == "InvalidArgumentError"
        assert r["bad_type"] == "InvalidArgumentError"


def test_local_group_created_by_init(results: dict[int, dict[str, Any]]) -> None:
    """init_process_group calls maybe_create_local_group_from_env (LOCAL_WORLD_SIZE)."""
    assert all(r["auto_local_group"] for r in results.values())


def test_object_collectives(results: dict[int, dict[str, Any]]) -> None:
    everyone = [{"rank": i, "sq": i * i} for i in range(WORLD)]
    for rank, r in results.items():
        node = rank // PER_NODE
        node_ranks = list(range(node * PER_NODE, (node + 1) * PER_NODE))
        assert r["all_gather"] == everyone
        assert r["all_gather_local"] == node_ranks
        assert r["gather0"] == ([10 * i for i in range(WORLD)] if rank == 0 else [])
        assert r["gather3"] == ([f"r{i}" for i in range(WORLD)] if rank == 3 else [])
        assert r["gather_local"] == (node_ranks if rank == node_ranks[0] else [])


def test_shared_random_seed_is_rank0s_draw(results: dict[int, dict[str, Any]]) -> None:
    expected = int(np.random.RandomState(0).randint(2**31))  # rank 0 seeded with 0
    assert {r["seed"] for r in results.values()} == {expected}


def test_reduce_dict(results: dict[int, dict[str, Any]]) -> None:
    ranks = range(WORLD)
    r0 = results[0]
    assert r0["reduce_avg"] == pytest.approx(
        {"loss": sum(ranks) / WORLD, "acc": sum(2 * i for i in ranks) / WORLD, "n": 1.0}
    )
    assert r0["reduce_sum"] == pytest.approx(
        {"loss": float(sum(ranks)), "acc": float(sum(2 * i for i in ranks)), "n": float(WORLD)}
    )
    assert r0["reduce_sum_acc_dtype"].startswith("float")  # stacked with float values
    assert r0["reduce_mixed"] == pytest.approx(sum(0.5 if i % 2 else 1.0 for i in ranks))
    for r in results.values():
        assert r["reduce_avg_keys"] == ["acc", "loss", "n"]
        assert r["reduce_sum_keys"] == ["acc", "loss", "n"]
        assert r["reduce_bad_shape"] == "InvalidArrayError"
        assert r["reduce_bad_type"] == "InvalidArrayError"


def test_after_destroy_is_a_world_of_one_again(results: dict[int, dict[str, Any]]) -> None:
    for r in results.values():
        assert r["post"] == {"world": 1, "rank": 0, "local_rank": 0, "local_size": 1}
