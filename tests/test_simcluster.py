"""The simulated cluster (procgroup.testing.simcluster): real namespaces, a real switch.

One 4-host cluster (100 Mbit/s links, 1 ms one-way delay) serves the checks of the tool
and a procgroup job across its hosts; smaller clusters check teardown and the CLI. The
link checks are bounds the switch guarantees by construction (a frame is held for the
delay; a port carries at most its rate), not timings of procgroup.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from procgroup.testing.simcluster import SetupError, SimCluster, leftovers, missing

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(missing() is not None, reason=f"simulated cluster: {missing()}"),
]

HOSTS = 4
RATE_BPS = 100e6
DELAY_S = 1e-3

WORKER = r"""
import json, os, socket
import numpy as np
import procgroup as pg

pg.init_process_group("tcp", timeout=60)
rank, size = pg.get_rank(), pg.get_world_size()
out = {"rank": rank, "size": size, "hostname": socket.gethostname()}

small = np.full(5, rank + 1, dtype=np.int64)
pg.all_reduce(small)                       # recursive doubling
big = np.arange(300_000, dtype=np.float64) * (rank + 1)
pg.all_reduce(big)                         # the pipelined ring (2.4 MB)
expect = np.arange(300_000, dtype=np.float64) * sum(range(1, size + 1))
out["all_reduce_small"] = small.tolist()
out["all_reduce_big_exact"] = bool(np.array_equal(big, expect))

b = np.arange(200_000, dtype=np.int32) if rank == 2 else np.zeros(200_000, dtype=np.int32)
pg.broadcast(b, src=2)
out["broadcast_exact"] = bool(np.array_equal(b, np.arange(200_000, dtype=np.int32)))

right, left = (rank + 1) % size, (rank - 1) % size
inbox = np.empty(100_000, dtype=np.int64)
work = pg.irecv(inbox, src=left)
pg.send(np.full(100_000, 1000 + rank, dtype=np.int64), dst=right)
work.wait()
out["recv_from_left"] = sorted(set(inbox.tolist()))

names = [None] * size
pg.all_gather_object(names, socket.gethostname())
out["hostnames"] = names
pg.barrier()
print("RESULT " + json.dumps(out), flush=True)
pg.destroy_process_group()
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    with SimCluster(HOSTS, rate=RATE_BPS, delay=DELAY_S) as c:
        yield c
    assert leftovers(c.tag) == []


def test_hosts_have_own_hostnames_and_addresses(cluster: SimCluster) -> None:
    results = cluster.run(
        ["sh", "-c", "echo $(hostname) $RANK $WORLD_SIZE $MASTER_ADDR"], timeout=60
    )
    lines = [r.stdout.split() for r in results]
    assert [r.returncode for r in results] == [0] * HOSTS, [r.stderr for r in results]
    assert lines == [[f"h{i}", str(i), str(HOSTS), "10.66.0.1"] for i in range(HOSTS)]
    # the root namespace's hostname is not any host's
    assert os.uname().nodename not in {f"h{i}" for i in range(HOSTS)}


def test_link_rate_is_enforced(cluster: SimCluster) -> None:
    """A raw TCP stream never beats the link's rate (generous bound: 5 % over it)."""
    (goodput,) = cluster.streams([(1, 2)], 4_000_000)
    assert 0 < goodput < 1.05 * RATE_BPS / 8, goodput


def test_delay_holds_every_frame(cluster: SimCluster) -> None:
    """A round trip crosses the switch twice, each time held for the delay."""
    assert cluster.rtt(0, 3, count=20) >= 2 * DELAY_S


def test_procgroup_job_across_hosts(cluster: SimCluster, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    results = cluster.run([sys.executable, str(script)], timeout=180, grace=10)
    report = "".join(
        f"--- {r.host.hostname}: exit {r.returncode}\n{r.stdout}\n{r.stderr}\n"
        for r in results
    )
    assert all(r.returncode == 0 for r in results), report
    by_rank = {}
    for r in results:
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
        out = json.loads(line[len("RESULT ") :])
        assert out["rank"] == r.host.index  # rank per host
        by_rank[out["rank"]] = out
    total = sum(range(1, HOSTS + 1))
    for rank, out in by_rank.items():
        assert out["size"] == HOSTS
        assert out["hostname"] == f"h{rank}"
        assert out["hostnames"] == [f"h{i}" for i in range(HOSTS)]
        assert out["all_reduce_small"] == [total] * 5
        assert out["all_reduce_big_exact"] is True
        assert out["broadcast_exact"] is True
        assert out["recv_from_left"] == [1000 + (rank - 1) % HOSTS]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_teardown_after_an_error_leaves_nothing() -> None:
    """An exception inside the block: commands, switch, TAPs and namespaces all go."""
    c = SimCluster(2, rate="1gbit", delay="0.1ms")
    with pytest.raises(RuntimeError, match="boom"), c:
        env = c.host_env(c.hosts[1], 29500)
        sleeper = c.popen(c.hosts[1], ["sleep", "300"], env)
        forwarder = c.forwarder_pid
        assert forwarder is not None and _alive(forwarder)
        assert leftovers(c.tag) != []
        raise RuntimeError("boom")
    assert leftovers(c.tag) == []
    assert sleeper.poll() is not None
    assert (
        forwarder is not None
    )  # (for mypy: pytest.raises may have swallowed the block)
    assert c.forwarder_pid is None and not _alive(forwarder)
    assert not os.path.exists(f"/etc/netns/{c.hosts[0].netns}")


def test_failing_host_stops_the_others() -> None:
    """One host fails: the others are killed after the grace period, not waited for."""
    with SimCluster(3, rate=None, delay=0) as c:
        results = c.run(
            [["sh", "-c", "exit 3"], ["sleep", "300"], ["sleep", "300"]],
            timeout=120,
            grace=1,
        )
        tag = c.tag
    assert results[0].returncode == 3
    assert [r.timed_out for r in results] == [False, True, True]
    assert all(r.returncode not in (None, 0) for r in results[1:])
    assert leftovers(tag) == []


def test_cli_runs_a_command_on_every_host() -> None:
    cmd = [sys.executable, "-m", "procgroup.testing.simcluster", "--hosts", "2"]
    ok = subprocess.run(
        [*cmd, "--", "sh", "-c", "echo rank=$RANK host=$(hostname)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert sorted(ln for ln in ok.stdout.splitlines() if "rank=" in ln) == [
        "[h0] rank=0 host=h0",
        "[h1] rank=1 host=h1",
    ]
    bad = subprocess.run(
        [*cmd, "--grace", "1", "--", "sh", "-c", 'exit "$((RANK + 4))"'],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 4, bad.stderr
    assert "# h1 (10.66.0.2): exit 5" in bad.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_interrupted_tears_down(sig: signal.Signals) -> None:
    """Ctrl-C (or SIGTERM) while commands run: they, the switch and the namespaces go."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "procgroup.testing.simcluster",
            "--hosts",
            "2",
            "--",
            "sh",
            "-c",
            "echo up; exec sleep 300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tag = f"pgsim{proc.pid}x1"
    try:
        assert proc.stdout is not None
        seen: set[str] = set()
        while len(seen) < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            if line.rstrip().endswith("] up"):
                seen.add(line.split("]")[0])
        assert leftovers(tag) != []
        sleepers = [p for ns in (f"{tag}-h0", f"{tag}-h1") for p in _pids_in(ns)]
        assert sleepers
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted; everything was torn down" in err
    assert leftovers(tag) == []
    assert not any(_alive(p) for p in sleepers)


def _pids_in(ns: str) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", ns], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split()]


def test_switch_that_cannot_start_is_a_clear_error() -> None:
    c = SimCluster(2, python="/nonexistent/python")
    with pytest.raises(SetupError, match="the forwarder did not start.*nonexistent"), c:
        pass
    assert leftovers(c.tag) == []
