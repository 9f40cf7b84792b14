"""Two-level collectives of the tcp backend on a simulated cluster (network namespaces).

One 3-host cluster (unlimited links, 50 us one way) serves every placement: a job per
placement runs every collective at several sizes and dtypes, on the world and on
sub-groups that span hosts partially, compares each result with NumPy's, and checks
that every rank got the same bits (a digest of each result, gathered). The placements
cover 2x2, 2x3, 3x2 (in blocks, and round-robin: rank r on host r mod 3) and an uneven
one (1, 3 and 2 ranks, mixed). Small pieces (PROCGROUP_TCP_PIECE_BYTES) make the pipelined paths run
with arrays of a few MB, and a small PROCGROUP_TCP_STREAMED_MIN_BYTES makes the larger sliced
all_reduces take the streamed ring (the smaller ones keep the pieces).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procgroup.algorithms.hierarchical import Topology
from procgroup.testing.simcluster import SimCluster, leftovers, missing

pytestmark = pytest.mark.timeout(300)
needs_cluster = pytest.mark.skipif(missing() is not None, reason=f"simulated cluster: {missing()}")

HOSTS = 3

#: placement name -> the ranks on each host
PLACEMENTS: dict[str, list[list[int]]] = {
    "2x2": [[0, 1], [2, 3]],
    "2x3": [[0, 1, 2], [3, 4, 5]],
    "3x2": [[0, 1], [2, 3], [4, 5]],
    "3x2-round-robin": [[0, 3], [1, 4], [2, 5]],
    "uneven-1-3-2": [[4], [0, 2, 5], [1, 3]],
}

#: starts this host's ranks of the job and waits for them (argv: worker, ranks, world size,
#: LOCAL_WORLD_SIZE: the ranks per host, or 1 where hosts differ, since init makes a local
#: group of LOCAL_WORLD_SIZE consecutive ranks, which only a uniform block placement has)
LAUNCH = r"""
import os, subprocess, sys
worker, ranks, world, per_host = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
procs = [subprocess.Popen([sys.executable, worker],
                          env=dict(os.environ, RANK=r, WORLD_SIZE=world, LOCAL_RANK=str(i),
                                   LOCAL_WORLD_SIZE=per_host))
         for i, r in enumerate(ranks)]
codes = [p.wait(timeout=240) for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""

WORKER = r"""
import hashlib, json, os
import numpy as np
import procgroup as pg
from procgroup import ReduceOp

pg.init_process_group("tcp", timeout=60)
me, n = pg.get_rank(), pg.get_world_size()
place = json.loads(os.environ["PGTEST_PLACEMENT"])
host_of = {r: h for h, ranks in enumerate(place) for r in ranks}
failures, digests, shapes = [], [], {}


def data(count, dtype, rank, salt=0):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.random.default_rng(rank * 7919 + count * 31 + salt).standard_normal(count).astype(dt)
    return ((np.arange(count, dtype=np.int64) * (rank + 3) + salt) % 5 + 1).astype(dt)


def check(name, got, want):
    exact = got.dtype.kind != "f"
    ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-4, atol=1e-4)
    if not ok:
        bad = np.flatnonzero(got != want)[:3].tolist()
        failures.append(f"rank {me}: {name}: differs at {bad}")
    digests.append((name, hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()))


def run_checks(g, members, label, full=True):
    m = len(members)
    gr = members.index(me)
    ch = pg.group_channel(g)
    shapes[label] = ch._two_level() is not None
    # 300_001 float32 are over SLICED_MIN_BYTES (every local rank leads a slice) and
    # several PROCGROUP_TCP_PIECE_BYTES; the others take one leader per host
    cases = [(3, "int64"), (20_000, "float32"), (300_001, "float32"), (300_001, "float64"), (300_001, "int64")]
    for count, dtype in cases if full else cases[:2]:
        ins = [data(count, dtype, r) for r in members]
        stack = np.stack(ins)
        ops = [ReduceOp.SUM, ReduceOp.MAX] + ([ReduceOp.AVG] if dtype != "int64" else [ReduceOp.PRODUCT])
        for op in ops:
            if op is ReduceOp.PRODUCT and count > 3:
                continue
            a = ins[gr].copy()
            pg.all_reduce(a, op=op, group=g)
            want = {ReduceOp.SUM: stack.sum(0), ReduceOp.MAX: stack.max(0), ReduceOp.AVG: stack.mean(0),
                    ReduceOp.PRODUCT: stack.prod(0)}[op].astype(dtype)
            check(f"{label} all_reduce {op.name} {dtype} x{count}", a, want)
        tag = f"{label} {dtype} x{count}"
        for root in sorted({0, m - 1}):
            b = ins[gr].copy()
            pg.broadcast(b, group_src=root, group=g)
            check(f"{tag} broadcast from {root}", b, ins[root])
            r = ins[gr].copy()
            pg.reduce(r, group_dst=root, op=ReduceOp.SUM, group=g)
            check(f"{tag} reduce to {root}", r, stack.sum(0).astype(dtype) if gr == root else ins[gr])
        if count > 20_000:
            continue
        outs = [np.empty(count, dtype) for _ in range(m)]
        pg.all_gather(outs, ins[gr], group=g)
        check(f"{tag} all_gather", np.concatenate(outs), np.concatenate(ins))
        root = m - 1
        glist = [np.empty(count, dtype) for _ in range(m)] if gr == root else None
        pg.gather(ins[gr], gather_list=glist, group_dst=root, group=g)
        if gr == root:
            check(f"{tag} gather", np.concatenate(glist), np.concatenate(ins))
        slist = [data(count, dtype, 100 + i) for i in range(m)]
        got = np.empty(count, dtype)
        pg.scatter(got, scatter_list=slist if gr == 1 % m else None, group_src=1 % m, group=g)
        check(f"{tag} scatter", got, slist[gr])
        blocks = {r: [data(count, dtype, r, salt=i) for i in range(m)] for r in members}
        out = np.empty(count, dtype)
        pg.reduce_scatter(out, blocks[me], op=ReduceOp.SUM, group=g)
        check(f"{tag} reduce_scatter", out, np.stack([blocks[r][gr] for r in members]).sum(0).astype(dtype))
        a2a_out = [np.empty(count, dtype) for _ in range(m)]
        pg.all_to_all(a2a_out, blocks[me], group=g)
        check(f"{tag} all_to_all", np.concatenate(a2a_out), np.concatenate([blocks[r][gr] for r in members]))
        pg.barrier(group=g)
    empty = np.empty(0, np.float32)  # a 0-byte collective runs the group's barrier
    pg.all_reduce(empty, group=g)
    check(f"{label} all_reduce of 0 bytes", empty, empty)


run_checks(pg.group.WORLD, list(range(n)), "world")
# a group that spans the hosts partially: every rank but the last of the second host
partial = [r for r in range(n) if r != place[1][-1]]
g1 = pg.new_group(partial)
if me in partial:
    run_checks(g1, partial, "partial")
# one rank per host: the flat algorithms
heads = sorted(ranks[0] for ranks in place)
g2 = pg.new_group(heads)
if me in heads:
    run_checks(g2, heads, "heads", full=False)
everyone = [None] * n
pg.all_gather_object(everyone, digests)
same_everywhere = ("all_reduce", "broadcast", "all_gather")  # every member holds the same result
mine = dict(digests)
for r, theirs in enumerate(everyone):
    for name, digest in theirs:
        if name in mine and mine[name] != digest and any(op in name for op in same_everywhere):
            failures.append(f"rank {me}: {name}: rank {r} got other bits")
with open(os.path.join(os.environ["PGTEST_OUT"], f"rank{me}.json"), "w") as f:  # ranks share a stdout
    json.dump({"rank": me, "failures": failures, "two_level": shapes, "checks": len(digests)}, f)
pg.destroy_process_group()
"""


DEATH = r"""
import json, os, time
import numpy as np
import procgroup as pg
from procgroup.errors import ProcGroupError

pg.init_process_group("tcp", timeout=60)
me = pg.get_rank()
a = np.ones(300_000, np.float32)
pg.all_reduce(a)  # the topology is learnt, the two-level path runs once
out = {"rank": me, "two_level": pg.group_channel()._two_level() is not None}
ready = os.path.join(os.environ["PGTEST_OUT"], "ready{}")
open(ready.format(me), "w").close()
if me == int(os.environ["PGTEST_VICTIM"]):
    # only once every rank is out of that all_reduce: a survivor still in it may fail it
    # (ULFM's rule: the collective in flight at a death completes on some ranks only)
    deadline = time.monotonic() + 60
    everyone = range(pg.get_world_size())
    while time.monotonic() < deadline and not all(os.path.exists(ready.format(r)) for r in everyone):
        time.sleep(0.01)
    os._exit(0)  # gone without a goodbye, as a crashed process
try:
    for _ in range(3):
        pg.all_reduce(a)
        pg.barrier()
    out["error"] = None
except ProcGroupError as exc:
    out["error"] = type(exc).__name__
    out["message"] = str(exc)
    out["blamed"] = getattr(exc, "rank", None)
with open(os.path.join(os.environ["PGTEST_OUT"], f"rank{me}.json"), "w") as f:
    json.dump(out, f)
# gone at once without a goodbye, as a process that dies of its error: a slower survivor
# may read this exit before the victim's death, and must still blame the victim
os._exit(0)
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster(HOSTS, rate=None, delay=50e-6) as c:
        yield c
    assert leftovers(c.tag) == []


def _run_job(cluster: SimCluster, tmp: Path, place: list[list[int]], worker: str = WORKER,
             extra: dict[str, str] | None = None) -> dict[int, dict[str, Any]]:
    (tmp / "worker.py").write_text(textwrap.dedent(worker))
    (tmp / "launch.py").write_text(textwrap.dedent(LAUNCH))
    world = sum(len(ranks) for ranks in place)
    blocks = all(ranks == list(range(ranks[0], ranks[0] + len(place[0]))) for ranks in place)
    per_host = str(len(place[0]) if blocks else 1)
    argvs = [
        [sys.executable, str(tmp / "launch.py"), str(tmp / "worker.py"), ",".join(map(str, place[h])), str(world),
         per_host]
        if h < len(place) else ["true"]
        for h in range(HOSTS)
    ]
    # rank 0's store listens on the host that runs rank 0: MASTER_ADDR names it
    master = next(h for h, ranks in enumerate(place) if 0 in ranks)
    env = {"PGTEST_PLACEMENT": json.dumps(place), "MASTER_ADDR": cluster.hosts[master].address,
           "PROCGROUP_TCP_PIECE_BYTES": str(256 * 1024), "PROCGROUP_TCP_STREAMED_MIN_BYTES": str(1 << 20),
           "PGTEST_OUT": str(tmp), **(extra or {})}
    results = cluster.run(argvs, env=env, timeout=240, grace=10)
    report = "".join(f"--- {r.host.hostname}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n"
                     for r in results)
    assert all(r.returncode == 0 for r in results), report
    found = {rank: json.loads((tmp / f"rank{rank}.json").read_text()) for rank in range(world)
             if (tmp / f"rank{rank}.json").exists()}
    if worker is WORKER:
        assert sorted(found) == list(range(world)), report
    return found


def test_topology_from_host_labels() -> None:
    """Hosts numbered by their lowest rank; leaders are the root on its host, else the
    first rank; a subset keeps its members' hosts; two levels only where they pay."""
    topo = Topology.from_labels(["b", "a", "b", "c", "a", "b"])
    assert topo.hosts == ((0, 2, 5), (1, 4), (3,))
    assert topo.host_of == (0, 1, 0, 2, 1, 0)
    assert topo.two_level and topo.min_per_host == 1 and topo.shape() == "3x(3,2,1)"
    assert topo.leaders() == [0, 1, 3] and topo.leaders(root=4) == [0, 4, 3]
    sub = topo.subset([1, 2, 3])  # group ranks 0, 1, 2 are world ranks 1, 2, 3: one per host
    assert sub.hosts == ((0,), (1,), (2,)) and not sub.two_level
    assert not Topology.from_labels(["x", "x", "x"]).two_level  # one host: the arena's or flat
    assert Topology.from_labels(["x", "y", "x", "y"]).shape() == "2x2"


@needs_cluster
@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_every_collective_on_placement(cluster: SimCluster, tmp_path: Path, name: str) -> None:
    place = PLACEMENTS[name]
    found = _run_job(cluster, tmp_path, place)
    failures = [f for r in found.values() for f in r["failures"]]
    assert failures == [], "\n".join(failures[:20])
    for rank, r in found.items():
        assert r["checks"] > 30, r
        # the world and the partial group span several hosts with several ranks on one:
        # two levels; one rank per host stays flat
        assert r["two_level"]["world"] is True, (rank, r)
        if "partial" in r["two_level"]:
            assert r["two_level"]["partial"] is True, (rank, r)
        if "heads" in r["two_level"]:
            assert r["two_level"]["heads"] is False, (rank, r)


@needs_cluster
def test_a_dead_rank_is_an_error_in_two_level_collectives(cluster: SimCluster, tmp_path: Path) -> None:
    """A rank that vanishes (no goodbye) between two-level all_reduces: every survivor's
    next collective raises the peer's death, naming it (on its host and on the other),
    rather than waiting for it until the timeout. Survivors exit at once after their
    error, also without a goodbye: the first failure still wins on the slower ones."""
    found = _run_job(cluster, tmp_path, PLACEMENTS["2x2"], DEATH, {"PGTEST_VICTIM": "1"})
    assert sorted(found) == [0, 2, 3], found
    for rank, r in found.items():
        assert r["two_level"] is True, (rank, r)
        # the peer's death, not a timeout (what a hang would end in)
        assert r["error"] is not None and "Timeout" not in r["error"], (rank, r)
        assert r["blamed"] == 1 and "rank 1" in r["message"], (rank, r)
