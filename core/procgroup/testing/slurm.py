"""A real Slurm cluster on one Linux machine, for tests: Debian's slurm-wlm and munge by hand.

The nodes are hosts of a :class:`~procgroup.testing.simcluster.SimCluster` (each its own
network and UTS namespace, so its own address and hostname): host ``h0`` is the
controller and login node (slurmctld; ``srun``/``sbatch`` run there), hosts ``h1`` ..
``hN`` are compute nodes, one ``slurmd`` each. One ``munged`` serves them all through a
socket in the cluster's temporary directory (a pathname socket reaches across network
namespaces); it runs in ``h0``'s namespace like the other daemons, so removing a cluster
whose creator was killed (``python -m procgroup.testing.simcluster --cleanup``, or the
next :meth:`SlurmCluster.start`) ends them all. No systemd, nothing under /etc: the configuration, state, spool directories,
logs and munge key live in one temporary directory that :meth:`SlurmCluster.close`
removes, with every daemon, on every exit path (an error while starting included).

    with SlurmCluster(nodes=2) as slurm:
        done = slurm.run(["srun", "-N", "2", "-n", "4", sys.executable, "job.py"])

Needs root, iproute2, /dev/net/tun (what SimCluster needs) and the ``slurm-wlm`` and
``munge`` packages; :func:`missing` says what is absent (tests skip with that reason).

Why the configuration is what it is:

- ``SlurmdParameters=config_overrides``: every node claims ``cpus`` CPUs whatever the
  machine has, so ``srun -N 2 -n 4`` fits on a 2-core test machine; without it slurmd
  reports its real count and the controller drains a node that claims more.
- ``ReturnToService=2``: a node that registers is usable at once, also after it was
  marked down (a slow start under load), instead of waiting for an administrator.
- ``NodeAddr`` per node is its namespace's address; ``NodeHostname`` its UTS hostname
  (slurmd is started with ``-N`` so it knows which node it is).
- ``ProctrackType=proctrack/pgid``, ``TaskPlugin=task/none``: no cgroups, which a
  container or CI runner may not delegate.
- ``AuthInfo=socket=...`` points every daemon and client at this cluster's munged.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from procgroup._launch.supervisor import pid_alive

from .simcluster import SimCluster, remove_cluster, stale_clusters
from .simcluster import missing as netns_missing
from .simcluster._cluster import kill_group
from .simcluster._netns import SetupError

log = logging.getLogger(__name__)

#: Programs the cluster needs (package in parentheses for the error message).
PROGRAMS = {
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "slurmstepd": "slurm-wlm",
    "srun": "slurm-wlm",
    "sbatch": "slurm-wlm",
    "scontrol": "slurm-wlm",
    "sinfo": "slurm-wlm",
    "munged": "munge",
    "mungekey": "munge",
}
#: seconds the daemons get to start and every node to become idle
START_TIMEOUT_S = 90.0
PARTITION = "debug"
#: a cluster's temporary directory is <tmp>/pgslurm-<creator pid>-<random>
DIR_PREFIX = "pgslurm-"


def _which(name: str) -> str | None:
    # the daemons live in /usr/sbin, which a non-login PATH may lack
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def missing() -> str | None:
    """Why no Slurm cluster can be built here (None when one can)."""
    why = netns_missing()
    if why:
        return why
    for program, package in PROGRAMS.items():
        if _which(program) is None:
            return (f"`{program}` is not installed (Debian package {package}: "
                    "apt-get install slurm-wlm munge)")
    return None


class SlurmCluster:
    """Slurm with ``nodes`` compute nodes of ``cpus`` CPUs each; a context manager.

    :attr:`env` is the environment for Slurm's commands (``SLURM_CONF`` set);
    :meth:`run` runs a command on the login node and waits for it.
    """

    def __init__(self, nodes: int = 2, cpus: int = 4, python: str | None = None) -> None:
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: at least 1")
        if cpus < 1:
            raise ValueError(f"cpus={cpus}: at least 1")
        self.nodes = nodes
        self.cpus = cpus
        self.python = python or sys.executable
        self.sim = SimCluster(hosts=nodes + 1, rate=None, delay=0.0, python=self.python)
        self.dir: Path | None = None
        self._daemons: list[subprocess.Popen[Any]] = []
        self._munged: subprocess.Popen[Any] | None = None

    # ------------------------------------------------------------------ layout
    @property
    def login(self) -> Any:
        """The controller and login host (``h0``)."""
        return self.sim.hosts[0]

    @property
    def compute(self) -> list[Any]:
        """The compute hosts (``h1`` ..)."""
        return self.sim.hosts[1:]

    @property
    def node_names(self) -> list[str]:
        return [h.hostname for h in self.compute]

    @property
    def conf(self) -> Path:
        assert self.dir is not None, "the cluster is not started"
        return self.dir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF; without the caller's own Slurm and rank variables."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "PMI_", "PMIX_", "OMPI_"))
               and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join(
            [os.path.dirname(self.python), env.get("PATH", ""), "/usr/sbin", "/sbin"])
        return env

    def log_text(self) -> str:
        """The daemons' logs and stderr (for a failure message)."""
        if self.dir is None:
            return ""
        parts = []
        for path in sorted([*self.dir.glob("*.log"), *self.dir.glob("*.out")]):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-4000:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ life cycle
    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Namespaces, munged, slurmctld, one slurmd per node; wait until all are idle."""
        why = missing()
        if why:
            raise SetupError(f"cannot build a Slurm cluster here: {why}")
        for tag in stale_clusters():  # namespaces and daemons of clusters whose creator died
            remove_cluster(tag)
        _remove_stale_dirs()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        os.chmod(self.dir, 0o755)  # munged refuses a socket directory others may write
        self.sim.start()
        self._start_munged()
        self._write_conf()
        # each daemon's stderr goes to a file of its own; the child holds its own descriptor,
        # so this process closes its copy as soon as the daemon started
        with open(self.dir / "slurmctld.out", "w") as err:
            self._daemons.append(self.sim.popen(
                self.login, [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)],
                self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))
        for host in self.compute:
            with open(self.dir / f"slurmd-{host.hostname}.out", "w") as err:
                self._daemons.append(self.sim.popen(
                    host, [*_with_host_cgroups(), _which("slurmd") or "slurmd", "-D", "-N",
                           host.hostname, "-f", str(self.conf)],
                    self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))
        self._wait_idle()

    def _start_munged(self) -> None:
        assert self.dir is not None
        munge = self.dir / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        subprocess.run([_which("mungekey") or "mungekey", "--create", "--keyfile", str(key)],
                       check=True, capture_output=True, timeout=30)
        os.chmod(key, 0o400)
        # in the login host's namespace like every daemon, so that removing a cluster whose
        # creator was killed (simcluster.remove_cluster) ends it too
        # stderr to a file: a pipe nobody reads would block munged once it filled
        err_path = self.dir / "munged.out"
        with open(err_path, "w") as err:
            self._munged = self.sim.popen(
                self.login,
                [_which("munged") or "munged", "-F", "-f", f"--socket={self.socket}",
                 f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                 f"--seed-file={munge / 'munged.seed'}", f"--log-file={self.dir / 'munged.log'}"],
                self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if self._munged.poll() is not None:
                text = err_path.read_text(errors="replace")
                raise SetupError(f"munged did not start ({self._munged.returncode}): {text.strip()[-2000:]}")
            if time.monotonic() > deadline:
                raise SetupError("munged did not create its socket within 30 s")
            time.sleep(0.05)

    @property
    def socket(self) -> str:
        assert self.dir is not None
        return str(self.dir / "munge" / "munge.sock")

    def _write_conf(self) -> None:
        d = self.dir
        assert d is not None
        for sub in ("state", "spool", *(f"spool/{n}" for n in self.node_names)):
            (d / sub).mkdir()
        nodes = "\n".join(
            f"NodeName={h.hostname} NodeAddr={h.address} NodeHostname={h.hostname} "
            f"CPUs={self.cpus} State=UNKNOWN"
            for h in self.compute)
        self.conf.write_text(textwrap.dedent(f"""\
            ClusterName=procgroup
            SlurmctldHost={self.login.hostname}({self.login.address})
            SlurmUser=root
            SlurmdUser=root
            AuthType=auth/munge
            CredType=cred/munge
            AuthInfo=socket={self.socket}
            StateSaveLocation={d}/state
            SlurmdSpoolDir={d}/spool/%n
            SlurmctldPidFile={d}/slurmctld.pid
            SlurmdPidFile={d}/slurmd-%n.pid
            SlurmctldLogFile={d}/slurmctld.log
            SlurmdLogFile={d}/slurmd-%n.log
            ProctrackType=proctrack/pgid
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/none
            SchedulerType=sched/backfill
            SelectType=select/cons_tres
            SelectTypeParameters=CR_CPU
            SlurmdParameters=config_overrides
            ReturnToService=2
            MpiDefault=none
            PropagateResourceLimits=NONE
            KillWait=5
            InactiveLimit=0
            SlurmctldTimeout=30
            SlurmdTimeout=60
            {nodes}
            PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
            """))

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            for proc in self._daemons:
                if proc.poll() is not None:
                    raise SetupError(
                        f"a Slurm daemon exited ({proc.returncode}) while starting:\n{self.log_text()}")
            done = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=30, check=False)
            last = done.stdout.strip()
            states = dict(line.split() for line in last.splitlines() if len(line.split()) == 2)
            if len(states) == self.nodes and all(s == "idle" for s in states.values()):
                log.info("slurm: nodes %s idle", ", ".join(states))
                return
            time.sleep(0.5)
        raise SetupError(
            f"the Slurm nodes did not become idle within {START_TIMEOUT_S:.0f} s "
            f"(sinfo: {last or 'nothing'}):\n{self.log_text()}")

    def close(self) -> None:
        """Stop every daemon (and job), remove the namespaces and the temporary directory."""
        for proc in reversed(self._daemons):
            kill_group(proc, grace=5.0)
        self._daemons.clear()
        if self._munged is not None:
            kill_group(self._munged, grace=5.0)
            self._munged = None
        self.sim.close()  # kills whatever still runs in the namespaces (job steps)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    # ------------------------------------------------------------------ commands
    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 300.0,
        check: bool = False,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the login node and wait (``timeout`` bounds it; then it is killed)."""
        full = self.env
        full.update(env or {})
        proc = self.sim.popen(self.login, [str(a) for a in argv], full,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=cwd)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc, grace=5.0)
            out, err = proc.communicate()
            raise SetupError(
                f"`{' '.join(map(str, argv))}` did not end within {timeout:.0f} s; "
                f"stdout: {out.strip()[-2000:]}\nstderr: {err.strip()[-2000:]}\n"
                f"{self.log_text()}") from None
        done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check and done.returncode != 0:
            raise SetupError(f"`{' '.join(map(str, argv))}` failed ({done.returncode}): {err.strip()}")
        return done

    def wait_job(self, job_id: str, timeout: float = 300.0) -> str:
        """Wait until job ``job_id`` has left the queue; its final state (from scontrol)."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            done = self.run(["scontrol", "-o", "show", "job", job_id], timeout=30)
            fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)
            state = fields.get("JobState", "")
            if done.returncode == 0 and state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(0.3)
        raise SetupError(f"job {job_id} still {state or 'unknown'} after {timeout:.0f} s")


def _remove_stale_dirs() -> None:
    """Remove the temporary directories of clusters whose creating process is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        pid = path.name[len(DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _with_host_cgroups() -> list[str]:
    """A prefix for a command in the cluster that gives it cgroup (v1) mounts to look at.

    ``ip netns exec`` mounts the namespace's own sysfs over /sys, which hides this
    machine's /sys/fs/cgroup; slurmd refuses to start without a cgroup filesystem there
    ("No filesystem mounted on /sys/fs/cgroup"), even with cgroup-free plugins. So the
    command's private mount namespace (ip netns exec made one) gets a tmpfs there with the
    v1 controllers Slurm knows mounted under it (those the kernel lacks are left out) and
    systemd's named hierarchy.
    """
    script = (
        "mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup || exit 1; "
        "for c in freezer cpuset memory devices cpuacct; do "
        "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c "
        "2>/dev/null || rmdir /sys/fs/cgroup/$c; done; "
        # autodetection stats systemd's hierarchy to tell v1 from a hybrid v2
        "mkdir -p /sys/fs/cgroup/systemd && "
        "(mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd 2>/dev/null || true); "
        'exec "$@"'
    )
    return ["sh", "-c", script, "sh"]


__all__ = ["SlurmCluster", "missing"]
