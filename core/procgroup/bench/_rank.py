"""The body of one rank: join the control group, connect the variants, run the sweep.

Timing (the convention the docs and the table header state): before every timed call the
ranks meet in the variant's own barrier; each rank then times its one call with
``perf_counter_ns``. The time of an iteration is the slowest rank's (MAX over ranks, as
nccl-tests with ``-a 3``), and a point's time is the median over its iterations, so a
stray slow iteration on a loaded machine does not move it. Ping-pong uses rank 0's round
trip, halved (one-way latency). Variants take turns in ``rounds`` per size (the order
rotates each round), so they see the same machine conditions.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import procgroup as pg
from procgroup import plugins
from procgroup.errors import InvalidArgumentError, ProcGroupError

from . import _raw, _raw_nccl, _torch
from ._options import Options, variant_options
from ._progress import Progress
from ._report import Record, fill_ratios, print_table, write_csv, write_json
from ._sweep import (
    OPS,
    Buffers,
    auto_iters,
    auto_warmup,
    bandwidths,
    check_result,
    fill_for_check,
    format_size,
    make_buffers,
)
from ._variants import Call, ProcGroupVariant, Variant

log = logging.getLogger(__name__)

#: Set by the spawner: where raw-pygloo's FileStore may live (a directory of this run).
SHARED_DIR_ENV = "PROCGROUP_BENCH_SHARED_DIR"
#: Set by the spawner: how the ranks were started (for the JSON metadata).
LAUNCHER_ENV = "PROCGROUP_BENCH_LAUNCHER"


@dataclass(frozen=True)
class Point:
    """One (op, size) of the sweep with its iteration plan."""

    op: str
    nbytes: int
    iters: int
    warmup: int
    rounds: int

    def round_iters(self, r: int) -> int:
        return self.iters // self.rounds + (1 if r < self.iters % self.rounds else 0)


def plan(opts: Options, world_size: int, n_variants: int) -> list[Point]:
    rounds = opts.rounds or (3 if n_variants > 1 else 1)
    points = []
    for op in opts.ops:
        for nbytes in opts.sizes_for(op, world_size):
            iters = opts.iters or auto_iters(nbytes)
            warmup = opts.warmup if opts.warmup is not None else auto_warmup(iters)
            points.append(Point(op, nbytes, iters, warmup, max(1, min(rounds, iters))))
    return points


# --------------------------------------------------------------------- control group
def _share(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    box = [value]
    pg.broadcast_object_list(box, src=0)
    return box[0]


def _gather(value: Any) -> list[Any]:
    out: list[Any] = [None] * pg.get_world_size()
    pg.all_gather_object(out, value)
    return out


def _agree(reason: str | None) -> str | None:
    """None when no rank has a reason, else the first rank's reason, naming the rank."""
    for r, why in enumerate(_gather(reason)):
        if why:
            return why if pg.get_world_size() == 1 else f"rank {r}: {why}"
    return None


def _host_identity() -> str:
    """The same string on every process of one machine (and one boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def topology(identities: list[str]) -> dict[str, Any]:
    """Hosts and ranks per host, from each rank's host identity (in rank order): hosts are
    numbered by their lowest rank; ``shape`` reads "4x2" (4 hosts of 2 ranks), or
    "3x(1,3,2)" where hosts differ."""
    hosts: dict[str, list[int]] = {}
    for rank, ident in enumerate(identities):
        hosts.setdefault(ident, []).append(rank)
    counts = [len(ranks) for ranks in hosts.values()]
    uniform = all(c == counts[0] for c in counts)
    shape = f"{len(counts)}x{counts[0]}" if uniform else f"{len(counts)}x({','.join(map(str, counts))})"
    return {"hosts": len(counts), "ranks_per_host": counts, "shape": shape,
            "placement": [ranks for ranks in hosts.values()]}


def _master_host() -> str:
    return os.environ.get("MASTER_ADDR") or "127.0.0.1"


def _mpi_bootstrap_env() -> None:
    """Under mpiexec without MASTER_ADDR/MASTER_PORT: agree on them over MPI (mpi4py)."""
    if os.environ.get("MASTER_PORT") or not _raw.under_mpi_launcher() or _raw.mpi4py_missing():
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    hosts = comm.allgather(socket.gethostname())
    port = 0
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1" if len(set(hosts)) == 1 else hosts[0])
    os.environ["MASTER_PORT"] = str(port)


def _control_backend(opts: Options) -> str:
    """The world (control) group: tcp when installed, as its Store serves every other group."""
    names = plugins.backends()
    if "tcp" in names and not names["tcp"].unavailable():
        return "tcp"
    return opts.backends[0]


# --------------------------------------------------------------------- variants
def _pg_variant(name: str, control: str, timeout: float) -> Callable[[], Variant]:
    def connect() -> Variant:
        if name == control:
            return ProcGroupVariant(name, None)
        backend, options = variant_options(name)
        return ProcGroupVariant(name, pg.new_group(list(range(pg.get_world_size())), backend=backend, timeout=timeout,
                                                   pg_options=options or None))
    return connect


def _pg_missing(name: str) -> str | None:
    try:
        spec = plugins.get_backend_spec(variant_options(name)[0])
    except ProcGroupError as exc:
        return str(exc)
    return spec.unavailable()


def gpu_sweep(opts: Options) -> bool:
    """A sweep with the nccl backend, where it can run, is on CuPy buffers on the GPUs
    (``_raw_nccl``); where it cannot, nccl is skipped with its reason, on host buffers."""
    return any(variant_options(name)[0] == "nccl" and _pg_missing(name) is None for name in opts.backends)


#: why a host-only comparison sits out a GPU sweep
_HOST_ONLY = "it takes host arrays only, and this sweep runs on GPU arrays (-B nccl)"


def _candidates(opts: Options, control: str, rank: int, n: int, shared_dir: str) -> list[tuple[str, str | None, Callable[[], Variant]]]:
    """(label, local reason it cannot run or None, connect) in the run's order."""
    host = _master_host()
    gpu = gpu_sweep(opts)
    out: list[tuple[str, str | None, Callable[[], Variant]]] = []
    for name in opts.backends:
        out.append((name, _pg_missing(name), _pg_variant(name, control, opts.timeout)))
    if "torch" in opts.compare:
        out.append(("torch-gloo", _HOST_ONLY if gpu else _torch.torch_missing(),
                    lambda: _torch.TorchGlooVariant(rank, n, host, opts.timeout, _share)))
    if "raw" in opts.compare and gpu:
        out.append(("raw-nccl", _raw_nccl.nccl_missing(), lambda: _raw_nccl.RawNcclVariant(rank, n, _share)))
        for label in ("raw-mpi4py", "raw-pygloo"):
            out.append((label, _HOST_ONLY, lambda: _raw.RawMpi4pyVariant(rank, n)))
    elif "raw" in opts.compare:
        out.append(("raw-mpi4py", _raw.mpi4py_missing(), lambda: _raw.RawMpi4pyVariant(rank, n)))
        why = _raw.pygloo_missing()
        if why is None and not _raw.dtype_supported_by_gloo(opts.dtype):
            why = f"dtype {opts.dtype} is not mapped for pygloo"
        if why is None and not os.path.isdir(shared_dir):
            why = f"directory {shared_dir} (rank 0's) is not visible here; pass --shared-dir on a shared filesystem"
        out.append(("raw-pygloo", why,
                    lambda: _raw.RawPyglooVariant(rank, n, host, shared_dir, opts.timeout)))
    return out


def connect_variants(opts: Options, control: str, rank: int, n: int, shared_dir: str,
                     notes: list[str]) -> list[Variant]:
    """Connect every variant all ranks can run, in order; the others become notes."""
    variants: list[Variant] = []
    for label, reason, connect in _candidates(opts, control, rank, n, shared_dir):
        why = _agree(reason)
        if why:
            notes.append(f"{label} skipped: {why}")
            continue
        variant: Variant | None = None
        err = None
        try:
            variant = connect()
        except Exception as exc:
            log.debug("connecting %s failed", label, exc_info=True)
            err = _one_line(exc)
        why = _agree(err)
        if why:
            notes.append(f"{label} skipped: could not connect: {why}")
            if variant is not None:
                _close_quietly(variant)
            continue
        assert variant is not None
        variants.append(variant)
    return variants


def _one_line(exc: BaseException) -> str:
    """An exception as one short line for notes (details are logged at DEBUG)."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:200]}"


def _close_quietly(v: Variant) -> None:
    try:
        v.close()
    except Exception:
        log.debug("closing %s failed", v.label, exc_info=True)


# --------------------------------------------------------------------- measuring
def _first_calls(v: Variant, p: Point, b: Buffers, rank: int, n: int, check: bool) -> tuple[Call | None, str | None]:
    """Bind the op, run it once on known data and check the result (agreed by all ranks)."""
    call: Call | None = None
    err = None
    try:
        call = v.prepare(p.op, b, rank, n)
        if not isinstance(b.send, np.ndarray):  # GPU buffers: the time includes the op itself
            call = _raw_nccl.synced(call)
        if check:
            fill_for_check(b, rank, n)
            v.barrier()
            call()
            err = check_result(b, rank, n)
            if err:
                err = f"wrong result at {p.nbytes} bytes: {err}"
        b.send[...] = 0  # zeros stay zeros however often they are summed
        b.recv[...] = 0
    except Exception as exc:
        log.debug("%s %s failed", v.label, p.op, exc_info=True)
        err = _one_line(exc)
    return call, _agree(err)


def _timed(v: Variant, call: Call, iters: int, sink: list[float]) -> None:
    for _ in range(iters):
        v.barrier()
        t0 = time.perf_counter_ns()
        call()
        sink.append((time.perf_counter_ns() - t0) / 1e3)


def run_sweep(opts: Options, variants: list[Variant], rank: int, n: int, progress: Progress,
              notes: list[str]) -> list[Record]:
    """Measure every point; rank 0 gets the records (other ranks an empty list)."""
    points = plan(opts, n, len(variants))
    xp = _raw_nccl.use_gpu(rank) if gpu_sweep(opts) else np
    progress.total = max(1, sum(p.rounds * len(variants) for p in points))
    disabled: dict[tuple[str, str], str] = {}
    for op in opts.ops:
        for v in variants:
            why = "needs at least 2 ranks" if op == "pingpong" and n < 2 else v.unsupported(op)
            if why:
                disabled[(op, v.label)] = why
    records: list[Record] = []
    for p in points:
        b = make_buffers(p.op, p.nbytes, opts.np_dtype, n, xp)
        calls: dict[str, Call] = {}
        times: dict[str, list[float]] = {v.label: [] for v in variants}
        for r in range(p.rounds):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                label = f"{p.op} {format_size(p.nbytes)} {v.label}"
                if (p.op, v.label) in disabled:
                    progress.step(label)
                    continue
                if r == 0:
                    call, why = _first_calls(v, p, b, rank, n, opts.check)
                    if why or call is None:
                        disabled[(p.op, v.label)] = why or "could not prepare"
                        if rank == 0:
                            progress.note(f"note: {v.label} {p.op} at {p.nbytes} B failed, "
                                          f"skipping this op for it: {why}")
                        progress.step(label)
                        continue
                    calls[v.label] = call
                    for _ in range(max(0, p.warmup - (1 if opts.check else 0))):
                        v.barrier()
                        call()
                else:
                    v.barrier()
                    calls[v.label]()  # one untimed call: the variant was idle while others ran
                _timed(v, calls[v.label], p.round_iters(r), times[v.label])
                progress.step(label)
        for v in variants:
            records.extend(_point_records(p, v.label, times[v.label], disabled.get((p.op, v.label)),
                                          rank, n, opts))
        del b, calls
    if rank == 0:
        for (op, label), why in disabled.items():
            notes.append(f"{label}: {op} not measured: {why}")
    return records


def _point_records(p: Point, label: str, times: list[float], why: str | None, rank: int, n: int,
                   opts: Options) -> list[Record]:
    """Reduce one variant's iteration times to rank 0 and turn them into a Record there."""
    if why is None and p.op != "pingpong":
        arr = np.asarray(times, dtype=np.float64)
        pg.reduce(arr, dst=0, op=pg.ReduceOp.MAX)  # the slowest rank, iteration by iteration
        times = arr.tolist()
    if rank != 0:
        return []
    count = p.nbytes // opts.np_dtype.itemsize
    if why is not None or not times:
        nan = math.nan
        return [Record(p.op, label, n, p.nbytes, count, opts.dtype, 0, 0, nan, nan, nan, nan, nan, nan,
                       status=why or "no data")]
    arr = np.asarray(times)
    if p.op == "pingpong":
        arr = arr / 2  # one-way latency = half the round trip
    med = float(np.median(arr))
    algbw, busbw = bandwidths(p.op, p.nbytes, med / 1e6, n)
    link = busbw * 1e9 / opts.link_rate if opts.link_rate else math.nan
    return [Record(p.op, label, n, p.nbytes, count, opts.dtype, p.iters, p.warmup, med, float(arr.min()),
                   float(arr.max()), algbw, busbw, math.nan, link_fraction=link)]


# --------------------------------------------------------------------- outputs
def _versions(variants: list[Variant]) -> dict[str, str]:
    out = {"procgroup": pg.__version__, "numpy": np.__version__, "python": platform.python_version()}
    for mod in ("torch", "mpi4py", "pygloo"):
        m = sys.modules.get(mod)
        if m is not None:
            out[mod] = str(getattr(m, "__version__", "?"))
    return out


def metadata(opts: Options, variants: list[Variant], n: int, control: str, launcher: str,
             notes: list[str], topo: dict[str, Any] | None = None) -> dict[str, Any]:
    rounds = opts.rounds or (3 if len(variants) > 1 else 1)
    return {
        "tool": "procgroup-bench",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": _versions(variants),
        "command": ["procgroup-bench", *sys.argv[1:]],
        "launcher": os.environ.get(LAUNCHER_ENV) or f"external ({launcher} set)",
        "world_size": n,
        "topology": topo,
        "link_rate_Bps": opts.link_rate,
        "dtype": opts.dtype,
        "ops": opts.ops,
        "backends": opts.backends,
        "compare": opts.compare,
        "variants": [v.label for v in variants],
        "reference": variants[0].label if variants else None,
        "control_backend": control,
        "iters": opts.iters if opts.iters else "auto: min(50, max(5, 256 MiB / size))",
        "warmup": opts.warmup if opts.warmup is not None else "auto: max(2, iters / 10)",
        "rounds": rounds,
        "check": opts.check,
        "timing": "barrier, then each rank times one call; iteration time = max over ranks; "
                  "reported time = median over iterations; pingpong: rank 0's round trip / 2",
        "units": {"time": "microseconds", "algbw": "GB/s (1e9 B/s)", "busbw": "GB/s (1e9 B/s)"},
        "busbw_factors": {op: OPS[op].summary for op in opts.ops},
        "notes": notes,
    }


def _write_outputs(opts: Options, records: list[Record], meta: dict[str, Any]) -> None:
    print_table(records, meta, sys.stdout)
    if opts.json:
        write_json(opts.json, records, meta)
        print(f"# wrote {opts.json}")
    if opts.csv:
        write_csv(opts.csv, records)
        print(f"# wrote {opts.csv}")
    if opts.plot:
        from ._plot import write_plot

        write_plot(opts.plot, records, meta)
        print(f"# wrote {opts.plot}")
    sys.stdout.flush()


def _shared_dir(opts: Options, rank: int) -> str:
    """A fresh directory of rank 0's for raw-pygloo's FileStore, under --shared-dir if given."""
    if "raw" not in opts.compare:
        return ""
    path = ""
    if rank == 0:
        base = opts.shared_dir or os.environ.get(SHARED_DIR_ENV) or None
        if base is not None and not os.path.isdir(base):
            raise InvalidArgumentError(f"--shared-dir {base!r} is not a directory")
        path = tempfile.mkdtemp(prefix="procgroup-bench-gloo-", dir=base)
    return str(_share(path))


def run_rank(opts: Options, launcher: str) -> int:
    """Everything one rank does; returns the exit status."""
    logging.basicConfig(level=opts.log_level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    control = _control_backend(opts)
    if control != "mpi":
        _mpi_bootstrap_env()
    pg.init_process_group(control, None if control == "mpi" else "env://", timeout=opts.timeout)
    rank, n = pg.get_rank(), pg.get_world_size()
    variants: list[Variant] = []
    shared = ""
    try:
        notes: list[str] = []
        topo = topology(_gather(_host_identity()))
        shared = _shared_dir(opts, rank)
        if gpu_sweep(opts):
            _raw_nccl.use_gpu(rank)  # before any variant touches CUDA
        variants = connect_variants(opts, control, rank, n, shared, notes)
        if not variants:
            msg = "nothing to measure: " + "; ".join(notes)
            if rank == 0:
                print(f"procgroup-bench: error: {msg}", file=sys.stderr)
            return 2
        if rank == 0:
            for note in notes:
                print(f"procgroup-bench: note: {note}", file=sys.stderr)
        progress = Progress(1, enabled=opts.progress and rank == 0)
        records = run_sweep(opts, variants, rank, n, progress, notes)
        if rank == 0:
            fill_ratios(records, variants[0].label)
            _write_outputs(opts, records, metadata(opts, variants, n, control, launcher, notes, topo))
        pg.barrier()
        return 0
    finally:
        for v in reversed(variants):
            _close_quietly(v)
        pg.destroy_process_group()
        if rank == 0 and shared:
            shutil.rmtree(shared, ignore_errors=True)
