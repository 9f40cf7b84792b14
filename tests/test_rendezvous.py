"""Every init method with 1, 2 and 4 real processes, automatic ranks, group_name
separation, timeouts that name the missing ranks, and every bad URL / variable error.

Four spawned worker processes are started once per module and run one rendezvous job
each per group, so a group of ranks costs no interpreter start-up. Multicast ranks run
as subprocesses inside a private network namespace (``ip netns``) with a multicast
route on its loopback, all jobs at once on one group address, told apart by group_name.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import pytest

from procgroup.errors import InvalidArgumentError
from procgroup.rendezvous import (
    HashStore,
    RendezvousResult,
    register_init_method,
    rendezvous,
)
from procgroup.rendezvous._env import RendezvousEnv

pytestmark = pytest.mark.timeout(180)

SAFE = 60.0  # timeout of rendezvous/waits that must succeed (loaded machine)
SHORT = 1.5  # timeout of rendezvous that must time out
N_WORKERS = 4
CTX = mp.get_context("spawn")
ENV_VARS = list(RendezvousEnv.model_fields)


# ---------------------------------------------------------------------- worker pool
def _rdzv_job(init_method: str, kwargs: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """One rank: rendezvous, exchange values through the store, leave together."""
    saved = dict(os.environ)
    for var in ENV_VARS:
        os.environ.pop(var, None)
    os.environ.update(env)
    try:
        r = rendezvous(init_method, **kwargs)
        s = r.store
        s.set(f"val/{r.rank}", str(r.rank * 10))
        vals = [int(s.get(f"val/{i}", SAFE)) for i in range(r.world_size)]
        s.add("sum", r.rank + 1)
        s.set(f"done/{r.rank}", b"")
        s.wait([f"done/{i}" for i in range(r.world_size)], SAFE)
        total = int(s.get("sum"))
        s.close()
        return {"rank": r.rank, "world_size": r.world_size, "master_addr": r.master_addr,
                "vals": vals, "sum": total}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _worker_loop(tasks: mp.Queue, results: mp.Queue) -> None:
    while True:
        item = tasks.get()
        if item is None:
            return
        idx, args = item
        try:
            results.put((idx, _rdzv_job(*args)))
        except BaseException as exc:  # noqa: BLE001 - the test asserts on the type and message
            results.put((idx, f"{type(exc).__name__}: {exc}"))


class Pool:
    def __init__(self) -> None:
        self.results: mp.Queue = CTX.Queue()
        self.tasks = [CTX.Queue() for _ in range(N_WORKERS)]
        self.procs = [CTX.Process(target=_worker_loop, args=(q, self.results), daemon=True)
                      for q in self.tasks]
        for p in self.procs:
            p.start()

    def run(self, jobs: list[tuple[str, dict[str, Any], dict[str, str]]]) -> list[Any]:
        """Run job i on worker i, all at once; results in job order."""
        assert len(jobs) <= N_WORKERS
        for i, job in enumerate(jobs):
            self.tasks[i].put((i, job))
        out: list[Any] = [None] * len(jobs)
        for _ in jobs:
            idx, res = self.results.get(timeout=SAFE * 2)
            out[idx] = res
        return out

    def close(self) -> None:
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(10)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    p = Pool()
    yield p
    p.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_group(results: list[Any], world_size: int) -> None:
    """Every rank exactly once, every value seen, every add counted."""
    for r in results:
        assert isinstance(r, dict), r
    assert sorted(r["rank"] for r in results) == list(range(world_size))
    for r in results:
        assert r["world_size"] == world_size
        assert r["vals"] == [10 * i for i in range(world_size)]
        assert r["sum"] == world_size * (world_size + 1) // 2


# ---------------------------------------------------------------------- env://
def _env_jobs(world_size: int, port: int) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    master = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if world_size == 1:
        return [("env://", {"timeout": SAFE}, {**master, "RANK": "0", "WORLD_SIZE": "1"})]
    if world_size == 2:
        return [
            ("env://", {"timeout": SAFE},
             {**master, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}),
            # arguments win over contradicting variables
            ("env://", {"rank": 1, "world_size": 2, "timeout": SAFE},
             {**master, "RANK": "0", "WORLD_SIZE": "5"}),
        ]
    return [
        ("env://", {"timeout": SAFE}, {**master, "PMI_RANK": "0", "PMI_SIZE": "4"}),
        ("env://", {"world_size": 4, "timeout": SAFE}, {**master, "PMIX_RANK": "1"}),
        # Slurm: MASTER_ADDR from the first host of the node list / the launch node
        ("env://", {"timeout": SAFE},
         {"MASTER_PORT": str(port), "SLURM_PROCID": "2", "SLURM_NTASKS": "4",
          "SLURM_JOB_NODELIST": "localhost,other[1-3]"}),
        ("env://", {"timeout": SAFE},
         {"MASTER_PORT": str(port), "SLURM_PROCID": "3", "SLURM_NTASKS": "4",
          "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1"}),
    ]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_env(pool: Pool, world_size: int) -> None:
    results = pool.run(_env_jobs(world_size, free_port()))
    check_group(results, world_size)
    addrs = [r["master_addr"] for r in results]
    if world_size == 4:
        assert addrs == ["127.0.0.1", "127.0.0.1", "localhost", "127.0.0.1"]
    else:
        assert set(addrs) == {"127.0.0.1"}


# ---------------------------------------------------------------------- tcp://
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_tcp(pool: Pool, world_size: int) -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    jobs = [(url, {"rank": r, "world_size": world_size, "timeout": SAFE}, {})
            for r in range(world_size)]
    if world_size == 4:  # rank and world_size may also come in the URL query
        jobs[3] = (url + "?rank=3&world_size=4", {"timeout": SAFE}, {})
    results = pool.run(jobs)
    check_group(results, world_size)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert {r["master_addr"] for r in results} == {"127.0.0.1"}


# ---------------------------------------------------------------------- file://
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_file_automatic_ranks(pool: Pool, world_size: int, tmp_path: Path) -> None:
    path = tmp_path / "rdzv"
    jobs = [(f"file://{path}", {"world_size": world_size, "timeout": SAFE}, {})] * world_size
    results = pool.run(jobs)
    check_group(results, world_size)
    assert all(r["master_addr"] is None for r in results)
    assert not path.exists()  # the last rank's close removed the file


def test_file_group_names_share_one_file(pool: Pool, tmp_path: Path) -> None:
    """Two jobs of 2 on one file at once: ranks 0 and 1 in each, no crosstalk."""
    url = f"file://{tmp_path / 'shared'}"
    jobs = [(url, {"world_size": 2, "group_name": g, "timeout": SAFE}, {})
            for g in ("jobA", "jobB", "jobA", "jobB")]
    results = pool.run(jobs)
    check_group(results[0::2], 2)
    check_group(results[1::2], 2)
    assert not (tmp_path / "shared").exists()


def test_file_explicit_ranks_and_conflicts(pool: Pool, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'f'}?world_size=2"
    results = pool.run([(url, {"rank": 1, "timeout": SAFE}, {}),
                        (url, {"rank": 0, "timeout": SAFE}, {})])
    check_group(results, 2)
    assert [r["rank"] for r in results] == [1, 0]
    # rank 0 twice (job "dup"); world sizes that disagree (job "ws")
    url = f"file://{tmp_path / 'g'}"
    results = pool.run([
        (url, {"rank": 0, "world_size": 2, "group_name": "dup", "timeout": SHORT}, {}),
        (url, {"rank": 0, "world_size": 2, "group_name": "dup", "timeout": SHORT}, {}),
        (url, {"rank": 0, "world_size": 2, "group_name": "ws", "timeout": SHORT}, {}),
        (url, {"rank": 1, "world_size": 3, "group_name": "ws", "timeout": SHORT}, {}),
    ])
    dup = sorted(results[:2])
    assert dup[0].startswith("RendezvousError: file://: rank 0 joined twice"), dup
    assert dup[1].startswith("StoreTimeoutError: file://: rendezvous timed out"), dup
    assert "1 of 2 ranks arrived; missing ranks [1]" in dup[1]
    ws = sorted(results[2:])
    assert ws[0].startswith("RendezvousError: file://: this rank says world_size="), ws
    # the first to arrive fixed the world size; the other rank's job is then incomplete
    assert ("1 of 2 ranks arrived; missing ranks [1]" in ws[1]
            or "1 of 3 ranks arrived; missing ranks [0, 2]" in ws[1]), ws


# ---------------------------------------------------------------------- timeouts
def test_timeouts_name_missing_ranks(pool: Pool, tmp_path: Path) -> None:
    tcp = f"tcp://127.0.0.1:{free_port()}"
    results = pool.run([
        (tcp, {"rank": 0, "world_size": 4, "timeout": SHORT}, {}),
        (tcp, {"rank": 1, "world_size": 4, "timeout": SHORT}, {}),
        (f"file://{tmp_path / 'f'}", {"world_size": 3, "timeout": SHORT}, {}),
        # rank 1 of an env:// job whose rank 0 never starts
        ("env://", {"timeout": SHORT},
         {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "1",
          "WORLD_SIZE": "2"}),
    ])
    for r in results[:2]:
        assert r.startswith("StoreTimeoutError: tcp://: rendezvous timed out after 1.5s"), r
        assert "2 of 4 ranks arrived; missing ranks [2, 3]" in r
    assert results[2].startswith("StoreTimeoutError: file://: rendezvous timed out"), results[2]
    assert "1 of 3 ranks arrived; missing ranks [1, 2]" in results[2]
    assert results[3].startswith("StoreTimeoutError: env://: rendezvous timed out"), results[3]
    assert "could not reach rank 0's store" in results[3]


# ---------------------------------------------------------------------- bad input
BAD = [
    # (init_method, kwargs, env, exception, message start, also in message)
    ("nourl", {}, {}, InvalidArgumentError, "'nourl': init_method must be a URL", ""),
    ("bogus://x", {}, {}, InvalidArgumentError, "bogus://: unknown init method",
     "choose one of: env://, file://, tcp://"),
    ("env://", {}, {}, InvalidArgumentError, "env://: RANK is not set", "OMPI_COMM_WORLD_RANK"),
    ("env://", {}, {"RANK": "0"}, InvalidArgumentError, "env://: WORLD_SIZE is not set",
     "SLURM_NTASKS"),
    ("env://", {"rank": 0, "world_size": 1}, {}, InvalidArgumentError,
     "env://: MASTER_ADDR is not set", "SLURM_JOB_NODELIST"),
    ("env://", {}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h"}, InvalidArgumentError,
     "env://: MASTER_PORT is not set", "environment variable"),
    ("env://", {}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "http"},
     InvalidArgumentError, "env://: environment variable MASTER_PORT='http' is invalid", ""),
    ("env://", {}, {"RANK": "0", "WORLD_SIZE": "0"}, InvalidArgumentError,
     "env://: environment variable WORLD_SIZE='0' is invalid", ""),
    ("env://", {}, {"OMPI_COMM_WORLD_RANK": "one"}, InvalidArgumentError,
     "env://: environment variable OMPI_COMM_WORLD_RANK='one' is invalid", ""),
    ("env://", {}, {"RANK": "5", "WORLD_SIZE": "2"}, InvalidArgumentError,
     "env://: rank 5 (from environment variable RANK) is out of range for world_size 2 "
     "(from environment variable WORLD_SIZE)", ""),
    ("env://", {"rank": 0, "world_size": 1}, {"MASTER_PORT": "5", "SLURM_JOB_NODELIST": "node[1-"},
     InvalidArgumentError, "env://: cannot read a host from SLURM_JOB_NODELIST='node[1-'", ""),
    ("env://?color=red", {}, {}, InvalidArgumentError, "env://: unknown URL parameter",
     "color"),
    ("tcp://127.0.0.1:29500", {"world_size": 2}, {}, InvalidArgumentError,
     "tcp://: rank must be given explicitly", ""),
    ("tcp://127.0.0.1:29500", {"rank": 0}, {}, InvalidArgumentError,
     "tcp://: world_size must be given explicitly", ""),
    ("tcp://:29500", {"rank": 0, "world_size": 1}, {}, InvalidArgumentError,
     "tcp://: the URL has no host", ""),
    ("tcp://somehost", {"rank": 0, "world_size": 1}, {}, InvalidArgumentError,
     "tcp://: the URL has no port", ""),
    ("tcp://somehost:99999", {"rank": 0, "world_size": 1}, {}, InvalidArgumentError,
     "tcp://: bad address", ""),
    ("tcp://h:1?rank=x", {"world_size": 1}, {}, InvalidArgumentError,
     "tcp://: URL parameter rank='x' is not an integer", ""),
    ("tcp://h:1", {"rank": 3, "world_size": 2}, {}, InvalidArgumentError,
     "tcp://: rank 3 (from argument) is out of range", ""),
    ("tcp://239.1.2.3:29500", {}, {}, InvalidArgumentError,
     "tcp://: world_size must be given explicitly", "multicast"),
    ("tcp://[ff15::1]:29500", {"rank": 0, "world_size": 2}, {}, InvalidArgumentError,
     "tcp://: ranks are assigned automatically", ""),
    ("file://relative/path", {"world_size": 1}, {}, InvalidArgumentError,
     "file://: the path must be absolute", ""),
    ("file:///tmp/", {"world_size": 1}, {}, InvalidArgumentError, "file://: the URL names no file",
     ""),
    ("file:///tmp/x", {}, {}, InvalidArgumentError, "file://: world_size must be given", ""),
    ("file:///no/such/dir/f", {"world_size": 1}, {}, InvalidArgumentError, "file://: ",
     "does not exist"),
    ("tcp://h:1", {"rank": -5, "world_size": 1}, {}, InvalidArgumentError,
     "tcp://: rank must be >= 0", "argument"),
    ("tcp://h:1", {"rank": 0, "world_size": 1, "timeout": 0}, {}, InvalidArgumentError,
     "tcp://: timeout=0: must be a positive number", ""),
    ("tcp://h:1", {"rank": 0, "world_size": 1, "group_name": 3}, {}, InvalidArgumentError,
     "tcp://: group_name must be a str", ""),
]


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD)])
def test_bad_input(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    url, kwargs, env, exc_type, start, also = case
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(exc_type) as info:
        rendezvous(url, **kwargs)
    assert str(info.value).startswith(start), str(info.value)
    assert also in str(info.value)


# ---------------------------------------------------------------------- extra schemes
def test_register_init_method() -> None:
    stores: dict[str, HashStore] = {}

    def handler(url: urllib.parse.SplitResult, *, rank: int, world_size: int,
                group_name: str, timeout: float) -> RendezvousResult:
        store = stores.setdefault(url.netloc, HashStore(timeout=timeout))
        return RendezvousResult(store, rank, world_size, None)

    register_init_method("inproc", handler)
    r = rendezvous("inproc://box", rank=0, world_size=1, group_name="g", timeout=5)
    assert (r.rank, r.world_size, r.store) == (0, 1, stores["box"])
    with pytest.raises(InvalidArgumentError, match="inproc://"):
        rendezvous("nosuch://x")  # the error lists the registered scheme
    with pytest.raises(InvalidArgumentError, match="^tcp://: is a built-in init method"):
        register_init_method("tcp", handler)
    with pytest.raises(InvalidArgumentError, match="must be callable"):
        register_init_method("other", "not callable")  # type: ignore[arg-type]  # a bad argument on purpose


def test_plugin_init_method() -> None:
    """A scheme contributed through the procgroup_init_methods hook is found lazily."""
    from procgroup import plugins
    from procgroup.hookspecs import InitMethodSpec, hookimpl

    def handler(url: urllib.parse.SplitResult, *, rank: int, world_size: int,
                group_name: str, timeout: float) -> RendezvousResult:
        return RendezvousResult(HashStore(timeout=timeout), rank, world_size, url.hostname)

    class Plugin:
        @hookimpl
        def procgroup_init_methods(self) -> list[InitMethodSpec]:
            return [InitMethodSpec("viaplugin", handler)]

    pm = plugins.get_plugin_manager()
    plugin = Plugin()
    pm.register(plugin)
    try:
        r = rendezvous("viaplugin://node7", rank=2, world_size=3, timeout=5)
        assert (r.rank, r.world_size, r.master_addr) == (2, 3, "node7")
    finally:
        pm.unregister(plugin)
    with pytest.raises(InvalidArgumentError, match="^viaplugin://: unknown init method"):
        rendezvous("viaplugin://node7", rank=2, world_size=3, timeout=5)


# ---------------------------------------------------------------------- multicast
MCAST_CODE = r"""
import json, sys
from procgroup.rendezvous import rendezvous
url, kwargs = sys.argv[1], json.loads(sys.argv[2])
try:
    r = rendezvous(url, **kwargs)
    s = r.store
    s.set(f"val/{r.rank}", str(r.rank * 10))
    vals = [int(s.get(f"val/{i}", 60)) for i in range(r.world_size)]
    s.add("sum", r.rank + 1)
    s.set(f"done/{r.rank}", b"")
    s.wait([f"done/{i}" for i in range(r.world_size)], 60)
    out = {"rank": r.rank, "world_size": r.world_size, "master_addr": r.master_addr,
           "vals": vals, "sum": int(s.get("sum"))}
    s.close()
except Exception as exc:
    out = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _host_multicast_works() -> bool:
    """Does a datagram sent to a multicast group come back to this host?"""
    group, port = "239.255.77.2", free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((group, port))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                         socket.inet_aton(group) + socket.inet_aton("0.0.0.0"))
            s.settimeout(1.0)
            s.sendto(b"probe", (group, port))
            return s.recv(16) == b"probe"
        except OSError:
            return False


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def netns() -> Iterator[tuple[list[str], bool]]:
    """(command prefix that runs inside a fresh namespace, whether IPv6 multicast works)."""
    name = f"pgrdzv{os.getpid()}"
    try:
        _sh("ip", "netns", "add", name)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or str(exc)
        if _host_multicast_works():  # e.g. not root, but the host has a multicast route
            yield [], False
            return
        pytest.skip(f"multicast test needs a network namespace (`ip netns add` failed: "
                    f"{detail!r}) or a multicast route on this host")
    try:
        _sh("ip", "-n", name, "link", "set", "lo", "up")
        _sh("ip", "-n", name, "route", "add", "224.0.0.0/4", "dev", "lo")
        try:  # IPv6 multicast does not loop back on lo: give it a veth pair
            _sh("ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            _sh("ip", "-n", name, "link", "set", "v0", "up")
            _sh("ip", "-n", name, "link", "set", "v1", "up")
            _sh("ip", "-n", name, "addr", "add", "fd01::1/64", "dev", "v0", "nodad")
            v6 = True
        except subprocess.SubprocessError:
            v6 = False
        yield ["ip", "netns", "exec", name], v6
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def test_multicast(netns: tuple[list[str], bool]) -> None:
    """All jobs at once on one multicast address and port, told apart by group_name."""
    prefix, v6 = netns
    url = "tcp://239.255.77.1:29571"
    jobs: list[tuple[str, str, dict[str, Any]]] = []  # (job, url, kwargs)
    for job, ws in [("solo", 1), ("pair", 2), ("quad", 4), ("sepA", 2), ("sepB", 2)]:
        # group names unique per run: concurrent runs may share a host's multicast group
        jobs += [(job, url, {"world_size": ws, "group_name": f"{job}-{os.getpid()}",
                             "timeout": SAFE})] * ws
    if v6:
        jobs += [("v6", "tcp://[ff15::77%v0]:29571",
                  {"world_size": 2, "group_name": f"v6-{os.getpid()}", "timeout": SAFE})] * 2
    jobs.append(("lonely", url, {"world_size": 2, "group_name": f"lonely-{os.getpid()}",
                                 "timeout": SHORT}))
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    procs = [
        subprocess.Popen(prefix + [sys.executable, "-c", MCAST_CODE, u, json.dumps(kw)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _, u, kw in jobs
    ]
    results: dict[str, list[Any]] = {}
    for (job, _, _), p in zip(jobs, procs, strict=True):
        out, err = p.communicate(timeout=SAFE * 2)
        assert p.returncode == 0, err
        results.setdefault(job, []).append(json.loads(out.strip().splitlines()[-1]))
    for job in ("solo", "pair", "quad", "sepA", "sepB") + (("v6",) if v6 else ()):
        check_group(results[job], len(results[job]))
        addrs = {r["master_addr"] for r in results[job]}
        assert len(addrs) == 1  # every rank reached the same rank 0
        addr = addrs.pop()
        # in the namespace rank 0's datagrams come from loopback / the veth; on a host,
        # from the interface that routes the multicast group
        assert addr in ("127.0.0.1", "fd01::1") if prefix else bool(addr)
    (lonely,) = results["lonely"]
    assert lonely.startswith("StoreTimeoutError: tcp://: rendezvous timed out after 1.5s"), lonely
    assert "1 of 2 ranks announced themselves" in lonely and "missing 1 ranks" in lonely


def test_multicast_strangers_are_ignored(netns: tuple[list[str], bool]) -> None:
    """Announcements are signed with the job's key: a process with another token (same
    group_name, address and port) never joins the job, and the job forms without it."""
    prefix, _ = netns
    url = "tcp://239.255.77.1:29572"
    name = f"tok-{os.getpid()}"
    jobs = [("job", {"world_size": 2, "group_name": name, "timeout": SAFE, "token": "ours"})] * 2
    jobs.append(("stranger", {"world_size": 2, "group_name": name, "timeout": SHORT,
                              "token": "theirs"}))
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    procs = [
        subprocess.Popen(prefix + [sys.executable, "-c", MCAST_CODE, url, json.dumps(kw)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _, kw in jobs
    ]
    results: dict[str, list[Any]] = {}
    for (job, _), p in zip(jobs, procs, strict=True):
        out, err = p.communicate(timeout=SAFE * 2)
        assert p.returncode == 0, err
        results.setdefault(job, []).append(json.loads(out.strip().splitlines()[-1]))
    check_group(results["job"], 2)
    (stranger,) = results["stranger"]
    assert stranger.startswith("StoreTimeoutError"), stranger
    assert "1 of 2 ranks announced themselves" in stranger
