"""The validated configuration of one ``procgroup-run`` invocation, and the parsers of
torchrun's value spellings (``--nproc-per-node auto``, ``--nnodes 2:2``, ``--redirects 0:3,1:1``,
``--rdzv-endpoint host:port``)."""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field

from procgroup.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

DEFAULT_RDZV_PORT = 29400  # torchrun's port when --rdzv-endpoint names none
STDOUT, STDERR = 1, 2  # bits of a --redirects/--tee value (3 = both), as torchrun's Std


@dataclass(frozen=True)
class LaunchOptions:
    """Everything the supervisor needs; built by :func:`procgroup.run.parse_args`."""

    target: str  # a script path, a module name (``module``) or a program (``no_python``)
    target_args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False  # execute TARGET directly (not through python)
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    backend: str | None = None
    prefix: bool = True
    log_dir: str | None = None
    redirects: dict[int, int] = field(default_factory=dict)  # local rank -> STDOUT|STDERR bits
    tee: dict[int, int] = field(default_factory=dict)
    local_ranks_filter: frozenset[int] | None = None  # local ranks shown on the console
    max_restarts: int = 0
    #: --keep-going: a failed rank does not stop the others; the job ends when all have
    keep_going: bool = False
    timeout: float | None = None
    grace_period: float = 5.0
    monitor_interval: float = 0.05
    run_id: str = "none"
    role: str = "default"
    mpiexec: str | None = None  # the mpiexec that starts the ranks (``--backend mpi``)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        """Ranks are numbered node by node: node k holds ranks k*n .. k*n+n-1."""
        return self.node_rank * self.nproc_per_node + local_rank

    def redirected(self, local_rank: int, stream: int) -> bool:
        """True when ``stream`` of this rank goes to its log file only (``--redirects``)."""
        return bool(self.redirects.get(local_rank, 0) & stream)

    def logged(self, local_rank: int, stream: int) -> bool:
        """True when ``stream`` of this rank is written to a log file."""
        return (self.log_dir is not None or self.redirected(local_rank, stream)
                or bool(self.tee.get(local_rank, 0) & stream))

    def shown(self, local_rank: int, stream: int) -> bool:
        """True when ``stream`` of this rank is copied to the launcher's console."""
        if self.local_ranks_filter is not None and local_rank not in self.local_ranks_filter:
            return False
        return not self.redirected(local_rank, stream)

    def validate(self) -> LaunchOptions:
        """Raise InvalidArgumentError naming the first bad option; return self."""
        if self.nproc_per_node < 1:
            raise InvalidArgumentError(
                f"--nproc-per-node must be >= 1, got {self.nproc_per_node}"
            )
        if self.nnodes < 1:
            raise InvalidArgumentError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise InvalidArgumentError(
                f"--node-rank must be in [0, {self.nnodes - 1}] for --nnodes {self.nnodes}, "
                f"got {self.node_rank}"
            )
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise InvalidArgumentError(
                f"--master-port must be in [1, 65535], got {self.master_port}"
            )
        if self.master_port is None and self.nnodes > 1:
            raise InvalidArgumentError(
                "--master-port is required with --nnodes > 1: every node's launcher must be "
                "given the same port (only a single-node job picks a free one itself)"
            )
        if not self.master_addr:
            raise InvalidArgumentError("--master-addr must not be empty")
        if self.max_restarts < 0:
            raise InvalidArgumentError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.keep_going and self.max_restarts:
            raise InvalidArgumentError(
                "--keep-going and --max-restarts exclude each other: with --keep-going the survivors "
                "go on after a failure, a restart would start every rank again")
        if self.keep_going and self.mpiexec is not None:
            # Refused here, before any rank starts: with MPICH's Hydra the first death ends the
            # whole job anyway, and mpiexec's survivor-keeping flags (-disable-auto-cleanup,
            # --with-ft ulfm) would leave survivors that can neither shrink nor finalize.
            raise InvalidArgumentError(
                "--keep-going does not work with --backend mpi: the mpi backend cannot let the "
                "survivors of a death go on, because MPI's fault tolerance (ULFM) is not usable "
                "with the MPI libraries procgroup was tested with (MPICH's ch4 device lacks it; "
                "under Open MPI 5 the survivors never get through MPI_Finalize), so mpiexec ends "
                "the whole job at the first death; use --backend tcp or --backend gloo with "
                "--keep-going (docs/fault-tolerance.md, 'mpi')")
        if self.timeout is not None and not self.timeout > 0:
            raise InvalidArgumentError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if not self.grace_period >= 0:
            raise InvalidArgumentError(
                f"--grace-period must be >= 0 seconds, got {self.grace_period}"
            )
        if not self.monitor_interval > 0:
            raise InvalidArgumentError(
                f"--monitor-interval must be > 0 seconds, got {self.monitor_interval}"
            )
        for name, spec in (("--redirects", self.redirects), ("--tee", self.tee)):
            bad = sorted(r for r in spec if not 0 <= r < self.nproc_per_node)
            if bad:
                raise InvalidArgumentError(
                    f"{name} names local rank(s) {bad}, outside [0, {self.nproc_per_node - 1}]"
                )
        if self.local_ranks_filter is not None:
            bad = sorted(r for r in self.local_ranks_filter if not 0 <= r < self.nproc_per_node)
            if bad:
                raise InvalidArgumentError(
                    f"--local-ranks-filter names local rank(s) {bad}, outside "
                    f"[0, {self.nproc_per_node - 1}]"
                )
        if not self.target:
            raise InvalidArgumentError("no script or -m module given")
        if self.backend is not None and not self.backend.strip():
            raise InvalidArgumentError("--backend must not be empty")
        if self.module and self.no_python:
            raise InvalidArgumentError(
                "-m and --no-python exclude each other: a module is run by python"
            )
        if not self.module and not self.no_python:
            if not os.path.isfile(self.target):
                raise InvalidArgumentError(f"script not found: {self.target!r}")
            what = non_python_kind(self.target)
            if what is not None:
                raise InvalidArgumentError(
                    f"{self.target!r} is not a Python script ({what}); to run a program, "
                    f"add --no-python: procgroup-run --no-python ... {self.target}"
                )
        return self


# ----- recognising a non-Python target ------------------------------------------------------


def non_python_kind(path: str) -> str | None:
    """What the file is when it is clearly not Python source, else None.

    A ``.py`` file is always Python; otherwise an ELF or other binary file (a NUL byte in its
    first 4 KiB) or a script whose ``#!`` line names another interpreter is not.
    """
    if path.endswith((".py", ".pyw")):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if head.startswith(b"\x7fELF"):
        return "an ELF executable"
    if b"\x00" in head:
        return "a binary file"
    if head.startswith(b"#!"):
        line = head.split(b"\n", 1)[0].decode("utf-8", "replace")
        if "python" not in line:
            return f"a script for {line[2:].strip()}"
    return None


# ----- torchrun's value spellings ------------------------------------------------------------


def gpu_count() -> int:
    """CUDA devices visible to this process (0 without CuPy or a driver)."""
    try:
        cupy = importlib.import_module("cupy")  # only for --nproc-per-node auto/gpu
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # noqa: BLE001  (no CuPy, no driver, no device: none)
        logger.debug("no CUDA devices: %s", err)
        return 0


def parse_nproc(value: str) -> int:
    """An int, or torchrun's ``auto`` (GPUs if any, else CPUs), ``cpu`` or ``gpu``."""
    v = value.strip().lower()
    if v == "cpu":
        return os.cpu_count() or 1
    if v == "gpu":
        n = gpu_count()
        if n == 0:
            raise InvalidArgumentError(
                "--nproc-per-node gpu: no CUDA device is visible (CuPy finds none)"
            )
        return n
    if v == "auto":
        return gpu_count() or os.cpu_count() or 1
    if v == "xpu":
        raise InvalidArgumentError("--nproc-per-node xpu: procgroup has no XPU support")
    try:
        return int(v)
    except ValueError:
        raise InvalidArgumentError(
            f"--nproc-per-node must be a number or auto, cpu, gpu; got {value!r}"
        ) from None


def parse_nnodes(value: str) -> int:
    """``N`` or torchrun's ``MIN:MAX`` with MIN == MAX (no elastic ranges)."""
    lo, sep, hi = value.partition(":")
    try:
        n_lo, n_hi = int(lo), int(hi if sep else lo)
    except ValueError:
        raise InvalidArgumentError(f"--nnodes must be N or N:N, got {value!r}") from None
    if n_lo != n_hi:
        raise InvalidArgumentError(
            f"--nnodes {value}: elastic ranges are not supported (procgroup worlds have a "
            f"fixed size); give one number"
        )
    return n_lo


def _decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts superscripts ('¹'), which int() refuses."""
    return text.isascii() and text.isdigit()


def parse_std(value: str, option: str) -> dict[int, int]:
    """torchrun's Std spec: ``0``-``3`` for every local rank (-1 key) or ``0:3,1:1``."""
    value = value.strip()
    err = InvalidArgumentError(
        f"{option} must be 0 (none), 1 (stdout), 2 (stderr), 3 (both) or a per-local-rank "
        f"map like 0:3,1:1; got {value!r}"
    )
    if _decimal(value):
        bits = int(value)
        if bits > 3:
            raise err
        return {-1: bits}
    out: dict[int, int] = {}
    for item in value.split(","):
        rank, sep, bits_s = item.partition(":")
        if not sep or not _decimal(rank.strip()) or not _decimal(bits_s.strip()):
            raise err
        bits = int(bits_s)
        if bits > 3:
            raise err
        out[int(rank)] = bits
    return out


def expand_std(spec: dict[int, int], nproc: int) -> dict[int, int]:
    """A parsed Std spec as local rank -> bits (the -1 key applies to every rank)."""
    if -1 in spec:
        return {r: spec[-1] for r in range(nproc)}
    return dict(spec)


def parse_ranks(value: str, option: str) -> frozenset[int]:
    """A comma-separated list of local ranks (``0,1,2``)."""
    try:
        return frozenset(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise InvalidArgumentError(
            f"{option} must be comma-separated local ranks like 0,2; got {value!r}"
        ) from None


def parse_endpoint(value: str) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6addr]:port`` (torchrun's default port 29400)."""
    v = value.strip()
    if v.startswith("["):
        host, _, rest = v[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else ""
    elif v.count(":") == 1:
        host, port_s = v.split(":")
    else:
        host, port_s = v, ""
    if not host:
        raise InvalidArgumentError(f"--rdzv-endpoint needs a host, got {value!r}")
    try:
        port = int(port_s) if port_s else DEFAULT_RDZV_PORT
    except ValueError:
        raise InvalidArgumentError(f"--rdzv-endpoint port must be a number, got {value!r}") from None
    return host, port
