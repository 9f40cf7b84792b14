"""SimCluster: N hosts (network + UTS namespaces) behind one rate- and delay-limited switch."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from . import _netns
from ._netns import SetupError

log = logging.getLogger(__name__)

SUBNET = ipaddress.ip_network("10.66.0.0/24")
MAX_HOSTS = 250
IFNAME = "eth0"
DEFAULT_QUEUE_BYTES = 2 * 1024 * 1024
#: seconds the switch may take to create its TAPs and say READY
FORWARDER_START_S = 30.0
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
_counter = 0
_counter_lock = threading.Lock()


def parse_rate(text: str) -> float:
    """Bits per second from ``1gbit``, ``100mbit``, ``10Gbit``, ``500kbit`` or a plain number."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)(bit|bps)?\s*", str(text).lower())
    if not m:
        raise ValueError(
            f"rate {text!r}: expected a number with kbit, mbit or gbit, e.g. 1gbit"
        )
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0:
        raise ValueError(f"rate {text!r}: must be positive")
    return value


def parse_delay(text: str) -> float:
    """Seconds from ``0.1ms``, ``100us``, ``1s`` or a plain number of seconds."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*(s|ms|us)?\s*", str(text).lower())
    if not m:
        raise ValueError(
            f"delay {text!r}: expected a number with s, ms or us, e.g. 0.1ms"
        )
    value = (
        float(m.group(1)) * {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
    )
    if value > 1.0:
        raise ValueError(f"delay {text!r}: at most 1 s")
    return value


@dataclass(frozen=True)
class Host:
    """One simulated machine."""

    index: int
    netns: str
    hostname: str
    address: str
    mac: str


@dataclass
class HostResult:
    """What a command did on one host."""

    host: Host
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False


@dataclass
class _Running:
    host: Host
    proc: subprocess.Popen[str]
    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)


def _pump(stream: IO[str], sink: list[str], echo: IO[str] | None, prefix: str) -> None:
    for line in stream:
        sink.append(line)
        if echo is not None:
            echo.write(prefix + line)
            echo.flush()


class SimCluster:
    """A simulated cluster; a context manager that always tears everything down.

    ``hosts`` machines, each its own network namespace and UTS namespace (hostname
    ``h<i>``, resolvable on every host), address ``10.66.0.<i+1>`` on ``eth0``. Every
    ``eth0`` is a TAP of one forwarder process (the switch): frames arrive ``delay``
    seconds after they were sent (one way, host to host), and each port (uplink: ``tc
    tbf`` on the host's TAP; downlink: the forwarder) carries at most ``rate``.
    ``rate=None`` leaves the links unlimited (the forwarder's own speed).
    """

    def __init__(
        self,
        hosts: int,
        rate: str | float | None = "1gbit",
        delay: str | float = "0.1ms",
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
        python: str | None = None,
    ) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"hosts={hosts}: between 1 and {MAX_HOSTS}")
        self.rate_bps = (
            None
            if rate is None
            else (float(rate) if isinstance(rate, (int, float)) else parse_rate(rate))
        )
        self.delay_s = (
            float(delay) if isinstance(delay, (int, float)) else parse_delay(delay)
        )
        self.queue_bytes = int(queue_bytes)
        self.python = python or sys.executable
        global _counter
        with _counter_lock:
            _counter += 1
            self.tag = f"{_netns.PREFIX}{os.getpid()}x{_counter}"
        self.switch_ns = f"{self.tag}-sw"
        self.hosts = [
            Host(
                i,
                f"{self.tag}-h{i}",
                f"h{i}",
                str(SUBNET[i + 1]),
                f"02:5e:00:00:{i // 256:02x}:{i % 256:02x}",
            )
            for i in range(hosts)
        ]
        self._forwarder: subprocess.Popen[str] | None = None
        self._forwarder_log: list[str] = []
        self._running: list[_Running] = []
        self._made: list[str] = []
        self.token = secrets.token_hex(16)

    # ----------------------------------------------------------------- life cycle
    def __enter__(self) -> SimCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Build the namespaces, start the switch, configure every host's link."""
        why = _netns.missing()
        if why:
            raise SetupError(f"cannot build a simulated cluster here: {why}")
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{h.address} {h.hostname}\n" for h in self.hosts
        )
        for ns in (self.switch_ns, *[h.netns for h in self.hosts]):
            _netns.run("ip", "netns", "add", ns)
            self._made.append(ns)
            _netns.run("ip", "-n", ns, "link", "set", "lo", "up")
        sysctl = "sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"
        for h in self.hosts:
            etc = _netns.NETNS_ETC / h.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            (etc / "hostname").write_text(h.hostname + "\n")
            _netns.run("ip", "netns", "exec", h.netns, *sysctl.split())
        self._start_forwarder()
        for h in self.hosts:
            # one `ip` per host; static neighbours: no ARP on a first connect
            batch = [
                f"link set {IFNAME} address {h.mac} mtu 1500 txqueuelen 1000",
                f"addr add {h.address}/{SUBNET.prefixlen} dev {IFNAME}",
                f"link set {IFNAME} up",
                *(
                    f"neigh replace {o.address} lladdr {o.mac} dev {IFNAME} nud permanent"
                    for o in self.hosts
                    if o is not h
                ),
            ]
            _netns.run(
                "ip", "-n", h.netns, "-batch", "-", stdin="\n".join(batch) + "\n"
            )
            if self.rate_bps is not None:
                # burst >= one 64 KiB TSO segment, or tbf would cut segments into wire frames
                burst = max(int(self.rate_bps / 8 * 0.001), 100_000)
                tbf = f"rate {int(self.rate_bps)}bit burst {burst} latency 20ms"
                _netns.run(
                    "tc",
                    "-n",
                    h.netns,
                    "qdisc",
                    "replace",
                    "dev",
                    IFNAME,
                    "root",
                    "tbf",
                    *tbf.split(),
                )
        log.info(
            "simcluster %s: %d hosts, rate %s bit/s, delay %g s",
            self.tag,
            len(self.hosts),
            self.rate_bps,
            self.delay_s,
        )

    def _start_forwarder(self) -> None:
        rate = self.rate_bps if self.rate_bps is not None else 1e15
        cmd = [
            "ip",
            "netns",
            "exec",
            self.switch_ns,
            self.python,
            "-m",
            "procgroup.testing.simcluster._forwarder",
            "--rate-bps",
            repr(rate),
            "--delay-s",
            repr(self.delay_s),
            "--queue-bytes",
            str(self.queue_bytes),
            "--ifname",
            IFNAME,
        ]
        for h in self.hosts:
            cmd += ["--netns", str(_netns.NETNS_RUN / h.netns)]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                p for p in [_package_root(), os.environ.get("PYTHONPATH")] if p
            ),
        )
        self._forwarder = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self._forwarder.stdout is not None and self._forwarder.stderr is not None
        threading.Thread(
            target=_pump,
            args=(self._forwarder.stderr, self._forwarder_log, None, ""),
            daemon=True,
        ).start()
        ready, _, _ = select.select([self._forwarder.stdout], [], [], FORWARDER_START_S)
        line = self._forwarder.stdout.readline() if ready else ""
        if line.strip() != "READY":
            kill_group(self._forwarder)
            time.sleep(0.1)  # let the log pump read what it said
            raise SetupError(
                f"the forwarder did not start: {''.join(self._forwarder_log).strip() or line}"
            )

    def close(self) -> None:
        """Kill what still runs on the hosts, stop the switch, remove every namespace."""
        for r in self._running:
            kill_group(r.proc)
        self._running.clear()
        fwd, self._forwarder = self._forwarder, None
        if fwd is not None:
            try:
                if fwd.stdin is not None:
                    fwd.stdin.close()
                fwd.wait(timeout=5)
            except (subprocess.TimeoutExpired, OSError):
                kill_group(fwd)
        for ns in reversed(self._made):
            _netns.delete(ns)
        self._made.clear()
        for h in self.hosts:  # /etc/netns dirs made before a failed `ip netns add`
            if (_netns.NETNS_ETC / h.netns).exists():
                _netns.delete(h.netns)

    # ----------------------------------------------------------------- faults
    def cut_link(self, index: int) -> None:
        """Take host ``index``'s link down (``ip link set eth0 down`` in its namespace):
        its processes stay alive but reach nobody and nobody reaches them, as when a
        host's cable or switch port fails. :meth:`restore_link` brings it back."""
        host = self._host(index)
        _netns.run("ip", "-n", host.netns, "link", "set", IFNAME, "down")
        log.info("simcluster %s: link of %s cut", self.tag, host.hostname)

    def restore_link(self, index: int) -> None:
        """Bring host ``index``'s link up again, with its address, route and neighbours."""
        host = self._host(index)
        batch = [
            f"link set {IFNAME} up",
            *(
                f"neigh replace {o.address} lladdr {o.mac} dev {IFNAME} nud permanent"
                for o in self.hosts
                if o is not host
            ),
        ]
        _netns.run("ip", "-n", host.netns, "-batch", "-", stdin="\n".join(batch) + "\n")
        log.info("simcluster %s: link of %s restored", self.tag, host.hostname)

    def _host(self, index: int) -> Host:
        if not 0 <= index < len(self.hosts):
            raise ValueError(f"host {index}: this cluster has hosts 0..{len(self.hosts) - 1}")
        if self.hosts[index].netns not in self._made:
            raise SetupError("the cluster is not started (use it as a context manager, or call start())")
        return self.hosts[index]

    @property
    def forwarder_pid(self) -> int | None:
        """The switch's process id while it runs (None before start and after close)."""
        return None if self._forwarder is None else self._forwarder.pid

    @property
    def forwarder_log(self) -> str:
        """What the forwarder said on stderr (its frame counts when it ended)."""
        return "".join(self._forwarder_log)

    # ----------------------------------------------------------------- commands
    def host_env(
        self, host: Host, master_port: int, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """The environment of a rank on ``host``: env:// variables, one rank per host.

        Also SIMCLUSTER_HOST (index), SIMCLUSTER_HOSTS, SIMCLUSTER_RATE_BPS (empty when
        unlimited) and SIMCLUSTER_DELAY_S, for scripts that record their setting.
        """
        env = dict(os.environ)
        for var in ("PROCGROUP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env.pop(var, None)
        env.update(
            RANK=str(host.index),
            WORLD_SIZE=str(len(self.hosts)),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=self.hosts[0].address,
            MASTER_PORT=str(master_port),
            PROCGROUP_JOB_TOKEN=env.get("PROCGROUP_JOB_TOKEN", self.token),
            GLOO_SOCKET_IFNAME=IFNAME,
            SIMCLUSTER_HOST=str(host.index),
            SIMCLUSTER_HOSTS=str(len(self.hosts)),
            SIMCLUSTER_RATE_BPS="" if self.rate_bps is None else repr(self.rate_bps),
            SIMCLUSTER_DELAY_S=repr(self.delay_s),
        )
        env.update(extra or {})
        return env

    def popen(
        self, host: Host, argv: Sequence[str], env: Mapping[str, str], **kw: Any
    ) -> subprocess.Popen[str]:
        """Start ``argv`` on ``host`` in its own UTS namespace (hostname set), own session."""
        wrapped = [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host.hostname,
            *argv,
        ]
        return subprocess.Popen(
            wrapped, env=dict(env), text=True, start_new_session=True, **kw
        )

    def run(
        self,
        argv: Sequence[str] | Sequence[Sequence[str]],
        *,
        env: Mapping[str, str] | None = None,
        master_port: int = 29500,
        timeout: float = 600.0,
        grace: float = 15.0,
        echo: IO[str] | None = None,
    ) -> list[HostResult]:
        """Run a command on every host (``argv``, or one argv per host) and wait for all.

        Ranks are host indices; MASTER_ADDR is host 0. Once one host's command fails the
        others get ``grace`` seconds, then are killed; ``timeout`` bounds the whole run.
        ``echo`` (e.g. sys.stdout) gets every line as it comes, prefixed ``[h<i>]``.
        """
        argvs: list[list[str]]
        if argv and not isinstance(argv[0], str):
            argvs = [[str(x) for x in a] for a in argv]
        else:
            argvs = [[str(x) for x in argv]] * len(self.hosts)
        if len(argvs) != len(self.hosts):
            raise ValueError(f"{len(argvs)} commands for {len(self.hosts)} hosts")
        running = []
        try:
            for h, cmd in zip(self.hosts, argvs):
                proc = self.popen(
                    h,
                    cmd,
                    self.host_env(h, master_port, env),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                )
                r = _Running(h, proc)
                self._running.append(r)
                running.append(r)
                for stream, sink in ((proc.stdout, r.out), (proc.stderr, r.err)):
                    t = threading.Thread(
                        target=_pump,
                        args=(stream, sink, echo, f"[{h.hostname}] "),
                        daemon=True,
                    )
                    t.start()
                    r.threads.append(t)
            return self._wait(running, timeout, grace)
        finally:
            for r in running:
                if r.proc.poll() is None:
                    kill_group(r.proc)
                if r in self._running:
                    self._running.remove(r)

    def _wait(
        self, running: list[_Running], timeout: float, grace: float
    ) -> list[HostResult]:
        deadline = time.monotonic() + timeout
        timed_out: set[int] = set()
        failed = False
        while any(r.proc.poll() is None for r in running):
            now = time.monotonic()
            if self._forwarder is not None and self._forwarder.poll() is not None:
                for r in running:
                    kill_group(r.proc)
                raise SetupError(
                    f"the switch (forwarder) died: {self.forwarder_log.strip()}"
                )
            if not failed and any(r.proc.returncode not in (None, 0) for r in running):
                failed, deadline = True, min(deadline, now + grace)
            if now >= deadline:
                for r in running:
                    if r.proc.poll() is None:
                        timed_out.add(r.host.index)
                        kill_group(r.proc)
                break
            time.sleep(0.05)
        results = []
        for r in running:
            r.proc.wait()
            for t in r.threads:
                t.join(timeout=5)
            results.append(
                HostResult(
                    r.host,
                    r.proc.returncode,
                    "".join(r.out),
                    "".join(r.err),
                    r.host.index in timed_out,
                )
            )
        return results

    def streams(
        self,
        pairs: Sequence[tuple[int, int]],
        nbytes: int,
        port: int = 5201,
        timeout: float = 120.0,
    ) -> list[float]:
        """Raw TCP streams, all at once, ``src -> dst`` host indices; goodput of each in bytes/s.

        Each receiver times from its first byte to its last (procgroup is not involved:
        this measures what the links and the switch carry).
        """
        mod = "procgroup.testing.simcluster._stream"
        argvs: list[list[str]] = [["true"] for _ in self.hosts]
        recv_at: dict[int, int] = {}
        senders: dict[int, int] = {}
        for k, (src, dst) in enumerate(pairs):
            if src == dst or dst in recv_at or src in senders:
                raise ValueError(
                    f"pairs {pairs}: one stream per sender and per receiver, between two hosts"
                )
            recv_at[dst] = k
            senders[src] = dst
        env = {
            "PYTHONPATH": os.pathsep.join(
                p for p in [_package_root(), os.environ.get("PYTHONPATH")] if p
            )
        }
        for h in self.hosts:
            parts = []
            if h.index in recv_at:
                parts.append(f"{self.python} -m {mod} recv {port} {nbytes} &")
            if h.index in senders:
                addr = self.hosts[senders[h.index]].address
                parts.append(f"{self.python} -m {mod} send {addr} {port} {nbytes}")
            argvs[h.index] = (
                ["sh", "-c", "\n".join([*parts, "wait"])] if parts else ["true"]
            )
        results = self.run(argvs, env=env, timeout=timeout, grace=5.0)
        rates = [0.0] * len(pairs)
        for res in results:
            if res.returncode != 0:
                raise SetupError(
                    f"stream on {res.host.hostname} failed ({res.returncode}): {res.stderr.strip()}"
                )
            for line in res.stdout.splitlines():
                if line.startswith("RECEIVED "):
                    got, secs = line.split()[1:]
                    rates[recv_at[res.host.index]] = int(got) / float(secs)
        return rates

    def rtt(self, src: int, dst: int, count: int = 200, port: int = 5202) -> float:
        """Median round-trip time of 8 bytes over TCP between two hosts, in seconds."""
        mod = "procgroup.testing.simcluster._stream"
        env = {
            "PYTHONPATH": os.pathsep.join(
                p for p in [_package_root(), os.environ.get("PYTHONPATH")] if p
            )
        }
        argvs = [["true"] for _ in self.hosts]
        argvs[dst] = [self.python, "-m", mod, "echo", str(port), str(count)]
        argvs[src] = [
            self.python,
            "-m",
            mod,
            "ping",
            self.hosts[dst].address,
            str(port),
            str(count),
        ]
        results = self.run(argvs, env=env, timeout=120, grace=5.0)
        for res in results:
            if res.returncode != 0:
                raise SetupError(
                    f"ping on {res.host.hostname} failed ({res.returncode}): {res.stderr.strip()}"
                )
        line = next(
            ln for ln in results[src].stdout.splitlines() if ln.startswith("RTT ")
        )
        return float(line.split()[1])


def kill_group(proc: subprocess.Popen[Any], grace: float = 3.0) -> None:
    """SIGTERM the process group of ``proc`` (its own session), SIGKILL after ``grace`` s."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _package_root() -> str:
    """The directory holding the ``procgroup`` package this module was imported from."""
    return os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
