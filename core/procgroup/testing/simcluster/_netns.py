"""Network-namespace plumbing for the simulated cluster: ``ip``, ``tc`` and their cleanup.

Every name a cluster makes starts with ``pgsim<pid>x<n>-`` (the creating process's pid),
so a cluster whose creator died can be found and removed (:func:`stale_clusters`), and a
test can check that nothing of its own cluster is left (:func:`leftovers`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from procgroup._launch.supervisor import pid_alive

PREFIX = "pgsim"
NETNS_RUN = Path("/var/run/netns")
#: `ip netns exec NS` bind-mounts the files of /etc/netns/NS over /etc (our /etc/hosts)
NETNS_ETC = Path("/etc/netns")
_TAG = re.compile(rf"^({PREFIX}(\d+)x\d+)-")


class SetupError(RuntimeError):
    """The host cannot build a simulated cluster; the message says what is missing."""


def run(*args: str, timeout: float = 30, stdin: str | None = None) -> str:
    """Run a command (``ip``, ``tc``, ``sysctl``); its stderr in the error when it fails."""
    proc = subprocess.run(
        list(args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise SetupError(
            f"`{' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout


def missing() -> str | None:
    """Why no cluster can be built here (None when one can)."""
    if os.uname().sysname != "Linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing (no TUN/TAP support)"
    return None


def namespaces() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    return [
        line.split()[0]
        for line in run("ip", "netns", "list").splitlines()
        if line.strip()
    ]


def pids_in(ns: str) -> list[int]:
    """Processes living in namespace ``ns``."""
    try:
        out = run("ip", "netns", "pids", ns)
    except SetupError:
        return []
    return [int(p) for p in out.split()]


def kill_all_in(ns: str, grace: float = 2.0) -> None:
    """SIGTERM the processes of ``ns`` (all started by this cluster), then SIGKILL stragglers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = pids_in(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and pids_in(ns):
            time.sleep(0.05)


def delete(ns: str) -> None:
    """Remove namespace ``ns`` (its devices go with it) and its /etc/netns directory."""
    kill_all_in(ns)
    subprocess.run(
        ["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False
    )
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def leftovers(tag: str) -> list[str]:
    """What of cluster ``tag`` still exists: namespaces (listed or as files), /etc/netns dirs.

    The TAPs live in the hosts' namespaces and the forwarder's process; processes in a
    namespace are killed before it is removed (:func:`delete`).
    """
    found = [f"netns {ns}" for ns in namespaces() if ns.startswith(f"{tag}-")]
    found += (
        [f"netns {p.name} (file)" for p in NETNS_RUN.glob(f"{tag}-*")]
        if NETNS_RUN.is_dir()
        else []
    )
    found += (
        [f"{NETNS_ETC / p.name}" for p in NETNS_ETC.glob(f"{tag}-*")]
        if NETNS_ETC.is_dir()
        else []
    )
    return sorted(set(found))


def stale_clusters() -> list[str]:
    """Tags of clusters whose creating process is gone."""
    names = set(namespaces())
    if NETNS_ETC.is_dir():
        names |= {p.name for p in NETNS_ETC.iterdir()}
    tags = set()
    for name in names:
        m = _TAG.match(name)
        if m and not pid_alive(int(m.group(2))):
            tags.add(m.group(1))
    return sorted(tags)


def remove_cluster(tag: str) -> None:
    """Delete every namespace (and /etc/netns dir) of cluster ``tag``."""
    names = {ns for ns in namespaces() if ns.startswith(f"{tag}-")}
    if NETNS_ETC.is_dir():
        names |= {p.name for p in NETNS_ETC.glob(f"{tag}-*")}
    for ns in sorted(names):
        delete(ns)
