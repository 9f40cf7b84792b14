"""A simulated cluster on one Linux machine, for tests and benchmarks across "hosts".

N hosts, each its own network namespace and UTS namespace (its own hostname, so
procgroup takes them for different machines and uses its socket path), joined to one
switch through links limited in rate (``tc tbf`` and a paced switch port) and delay (a
user-space forwarder: the kernel here has no ``sch_netem``). Needs root, iproute2 and
/dev/net/tun; :func:`missing` says what is absent.

    with SimCluster(hosts=4, rate="1gbit", delay="0.1ms") as cluster:
        results = cluster.run([sys.executable, "job.py"])   # rank = host index

or from a shell: ``python -m procgroup.testing.simcluster --hosts 4 -- CMD ...``.
Everything (namespaces, TAPs, the forwarder, the commands) is removed on exit, on an
error and on Ctrl-C; ``--cleanup`` removes what a killed run left.
"""

from ._cluster import Host, HostResult, SimCluster, parse_delay, parse_rate
from ._netns import SetupError, leftovers, missing, remove_cluster, stale_clusters

__all__ = [
    "Host",
    "HostResult",
    "SetupError",
    "SimCluster",
    "leftovers",
    "missing",
    "parse_delay",
    "parse_rate",
    "remove_cluster",
    "stale_clusters",
]
