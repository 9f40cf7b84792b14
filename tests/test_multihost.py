"""Jobs across "hosts": Linux network namespaces on this machine, one procgroup-run each.

Topology (created here, removed in a finalizer; nothing touches the root namespace):
a "switch" namespace holds two bridges, net A 10.77.0.0/24 and net B 10.78.0.0/24; each of
three host namespaces has ``ethA`` (10.77.0.<i+1>) and ``ethB`` (10.78.0.<i+1>), veth pairs
plugged into the bridges. Rank 0's store runs on host 0 at 10.77.0.1 (MASTER_ADDR).

Which address the tcp backend published is read from the outside, backend-agnostically:
each rank lists its own ESTABLISHED TCP sockets (/proc/self/fd + /proc/self/net/tcp*),
drops the store connections (MASTER_PORT), and reports the peer connections' endpoints;
peers connect to the published addresses, so those endpoints show which interface was used.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

HOSTS, PER_HOST = 3, 2
MASTER_PORT = "29400"
NET_A = ipaddress.ip_network("10.77.0.0/24")
NET_B = ipaddress.ip_network("10.78.0.0/24")

WORKER = r'''
import ipaddress, json, os, socket
import numpy as np
import procgroup as pg

def _addr(hexaddr):
    ip_hex, port_hex = hexaddr.split(":")
    raw = bytes.fromhex(ip_hex)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
        ip = ip.ipv4_mapped or ip
    return str(ip), int(port_hex, 16)

def my_tcp_sockets():
    """(state, local, remote) of this process's TCP sockets: /proc/self/fd x /proc/self/net."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[9] in inodes:
                    found.append((parts[3], _addr(parts[1]), _addr(parts[2])))
    return found

pg.init_process_group(timeout=90)
rank, size = pg.get_rank(), pg.get_world_size()
a = np.full(3, float(rank + 1))
pg.all_reduce(a)
hosts = [None] * size
pg.all_gather_object(hosts, os.environ["PGTEST_HOST"])
store_port = int(os.environ["MASTER_PORT"])
peer = [(l, r) for state, l, r in my_tcp_sockets()
        if state == "01" and store_port not in (l[1], r[1])]   # 01 = ESTABLISHED
pg.barrier()  # nobody closes a connection before everyone has looked
print("RESULT " + json.dumps({"rank": rank, "size": size, "sum": a.tolist(), "hosts": hosts,
                             "peer": peer}), flush=True)
pg.destroy_process_group()
'''


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Netns:
    """Three host namespaces and a switch namespace (see the module docstring)."""

    def __init__(self) -> None:
        tag = f"pg{os.getpid() % 100000}"
        self.switch = f"{tag}sw"
        self.hosts = [f"{tag}h{i}" for i in range(HOSTS)]
        self.created: list[str] = []

    def create(self) -> None:
        for ns in (self.switch, *self.hosts):
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        for br in ("brA", "brB"):
            _ip("-n", self.switch, "link", "add", br, "type", "bridge")
            _ip("-n", self.switch, "link", "set", br, "up")
        for i, ns in enumerate(self.hosts):
            for net, side in (("A", NET_A), ("B", NET_B)):
                dev, port = f"eth{net}", f"{net.lower()}{i}"
                _ip("link", "add", dev, "netns", ns, "type", "veth", "peer", "name", port,
                    "netns", self.switch)
                _ip("-n", self.switch, "link", "set", port, "master", f"br{net}", "up")
                _ip("-n", ns, "addr", "add", f"{side[i + 1]}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")

    def delete(self) -> None:
        for ns in reversed(self.created):  # removing a namespace removes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        self.created.clear()


@pytest.fixture(scope="module")
def netns(request: pytest.FixtureRequest) -> Iterator[Netns]:
    if sys.platform != "linux":
        pytest.skip("netns: network namespaces need Linux")
    if os.geteuid() != 0:
        pytest.skip("netns: creating network namespaces needs root")
    if shutil.which("ip") is None:
        pytest.skip("netns: the `ip` tool (iproute2) is not installed")
    n = Netns()
    request.addfinalizer(n.delete)
    try:
        n.create()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"netns: cannot create network namespaces here: {exc.stderr.strip()}")
    yield n


def run_job(n: Netns, tmp: Path, ifnames: list[str | None]) -> dict[int, dict[str, Any]]:
    """One procgroup-run per host namespace; per-rank results by rank."""
    script = tmp / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    procs = []
    for i, ns in enumerate(n.hosts):
        env = dict(os.environ, PGTEST_HOST=f"h{i}")
        env.pop("PROCGROUP_SOCKET_IFNAME", None)
        if ifnames[i] is not None:
            env["PROCGROUP_SOCKET_IFNAME"] = str(ifnames[i])
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "procgroup.run",
             "--nnodes", str(HOSTS), "--node-rank", str(i), "--nproc-per-node", str(PER_HOST),
             "--master-addr", str(NET_A[1]), "--master-port", MASTER_PORT, "--backend", "tcp",
             "--timeout", "150", "--grace-period", "2", str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        ))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=200))
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    report = "".join(
        f"--- host {i}: exit {p.returncode}\nstdout:\n{out}\nstderr:\n{err}\n"
        for i, (p, (out, err)) in enumerate(zip(procs, outs))
    )
    assert all(p.returncode == 0 for p in procs), report
    results = {}
    for out, _ in outs:
        for line in out.splitlines():
            if "RESULT " in line:
                r = json.loads(line.split("RESULT ", 1)[1])
                results[r["rank"]] = r
    assert sorted(results) == list(range(HOSTS * PER_HOST))
    return results


def check_job(results: dict[int, dict[str, Any]], net: ipaddress.IPv4Network) -> None:
    world = HOSTS * PER_HOST
    expected_hosts = [f"h{r // PER_HOST}" for r in range(world)]
    remote_hosts = set()
    for rank, r in results.items():
        assert r["size"] == world
        assert r["sum"] == [float(sum(range(1, world + 1)))] * 3
        assert r["hosts"] == expected_hosts
        own = str(net[rank // PER_HOST + 1])
        for (laddr, _lport), (raddr, _rport) in r["peer"]:
            # the peer connections use the addresses of the chosen interface only
            assert laddr == own, (rank, r["peer"])
            assert ipaddress.ip_address(raddr) in net, (rank, r["peer"])
            remote_hosts.add(raddr)
    # traffic really crossed hosts: peers on other namespaces' addresses were connected
    assert len(remote_hosts) >= 2, results


def test_job_across_namespaces_uses_route_to_master(netns: Netns, tmp_path: Path) -> None:
    """Default: the interface that routes to MASTER_ADDR (ethA, net A) is published."""
    check_job(run_job(netns, tmp_path, [None] * HOSTS), NET_A)


def test_socket_ifname_picks_named_interface(netns: Netns, tmp_path: Path) -> None:
    """PROCGROUP_SOCKET_IFNAME (a name, or an exclusion list) moves data traffic to net B
    while the store stays on MASTER_ADDR in net A."""
    check_job(run_job(netns, tmp_path, ["ethB", "^lo,ethA", "ethB"]), NET_B)
