"""Command-line options of procgroup-bench, checked before any rank starts."""

from __future__ import annotations

import argparse
import importlib.util
import re
from dataclasses import dataclass, field

import numpy as np

from procgroup.errors import InvalidArgumentError

from ._sweep import DTYPES, effective_sizes, parse_ops, parse_size, size_sweep

COMPARES = ("torch", "raw")
PLOT_HINT = "pip install 'procgroup[bench]' (or pip install matplotlib)"


@dataclass
class Options:
    """Validated settings; every rank parses the same command line into the same Options."""

    nprocs: int = 2
    backends: list[str] = field(default_factory=lambda: ["tcp"])
    compare: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=lambda: ["all_reduce"])
    sizes: list[int] = field(default_factory=list)
    iters: int | None = None
    warmup: int | None = None
    rounds: int | None = None
    dtype: str = "float32"
    timeout: float = 120.0
    job_timeout: float = 3600.0
    check: bool = True
    json: str | None = None
    csv: str | None = None
    plot: str | None = None
    shared_dir: str | None = None
    progress: bool = True
    log_level: str = "WARNING"
    log_busbw: bool = False
    #: --link-rate in bytes per second: bus bandwidth is also shown as a fraction of it
    link_rate: float | None = None

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    def sizes_for(self, op: str, world_size: int) -> list[int]:
        return effective_sizes(op, self.sizes, world_size, self.np_dtype.itemsize)


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a whole number, got {text!r}") from None
    if value < 1:
        raise InvalidArgumentError(f"{name} must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="procgroup-bench",
        description="Measure procgroup collectives and send/recv over a size sweep: median time, "
                    "algbw and busbw (nccl-tests definitions), side by side for several backends.",
        epilog="Under mpiexec or procgroup-run (RANK/WORLD_SIZE or PMI variables set) the ranks are "
               "the launcher's and -n is ignored. See docs/benchmarking.md.",
    )
    a = p.add_argument
    # nccl-tests' spellings: -b/-e/-f (sweep), -n (iterations), -w (warmup), -c (check)
    a("-np", "-N", "--nprocs", dest="nprocs", default="2", help="ranks to start on this host (default 2)")
    a("--backend", "-B", default="tcp", help="procgroup backends, comma separated (default tcp); "
      "the first is the reference of the ratio column; NAME[key=value;...] passes options to the "
      "backend (a channel of its own), e.g. tcp[shm=0] for the socket path")
    a("--compare", action="append", default=[], metavar="{torch,raw}",
      help="also run torch.distributed gloo (torch) and/or raw mpi4py and pygloo (raw) in the same sweep")
    a("--op", "-o", default="all_reduce", help="ops, comma separated: all_reduce, broadcast, reduce, all_gather, "
      "reduce_scatter, all_to_all, pingpong, or all (default all_reduce)")
    a("-b", "--min-bytes", "--minbytes", dest="min_bytes", default="16", help="smallest size (default 16)")
    a("-e", "--max-bytes", "--maxbytes", dest="max_bytes", default="64M", help="largest size, inclusive (default 64M)")
    a("-f", "--factor", "--stepfactor", dest="factor", default="4", help="size multiplier between steps (default 4)")
    a("--sizes", default=None, help="explicit sizes, comma separated (e.g. 1K,1M); overrides min/max/factor")
    a("-n", "--iters", default=None, help="timed iterations per size and variant (default: 50 for small sizes, "
      "down to 5 at 64 MiB and above)")
    a("-w", "--warmup", "--warmup_iters", dest="warmup", default=None,
      help="untimed iterations before timing (default max(2, iters/10))")
    a("--rounds", default=None, help="interleave the variants in this many rounds per size, the iterations "
      "split among them (default 3 with several variants, else 1)")
    a("--dtype", default="float32", choices=DTYPES)
    a("--timeout", default="120", help="seconds any one blocking call may take (default 120)")
    a("--job-timeout", default="3600", help="seconds the whole spawned job may take (default 3600)")
    a("--no-check", action="store_true", help="skip the correctness check of each op's first call")
    a("-c", "--check", default=None, metavar="{0,1}", help="nccl-tests' spelling: -c 0 is --no-check (default 1)")
    a("--json", default=None, metavar="FILE", help="write results and run metadata as JSON")
    a("--csv", default=None, metavar="FILE", help="write one row per (op, size, variant)")
    a("--plot", default=None, metavar="FILE", help="plot bandwidth and time vs size (needs matplotlib)")
    a("--log-busbw", action="store_true", help="--plot: bus bandwidth on a log axis (default linear)")
    a("--link-rate", default=None, metavar="RATE",
      help="the network link's rate (e.g. 1Gbit, 100gbit, 25Gbit/s, 12.5GB/s): bus bandwidth is also "
           "shown as a fraction of it (the link column)")
    a("--shared-dir", default=None, metavar="DIR",
      help="directory every rank can reach, for raw-pygloo's FileStore (default: a temporary directory; "
           "multi-host runs need a shared one)")
    a("-q", "--quiet", action="store_true", help="no progress bar")
    a("--log-level", default="WARNING", help="logging level of the ranks (default WARNING)")
    return p


def parse_options(argv: list[str]) -> Options:
    """Parse and check ``argv``; bad values raise InvalidArgumentError naming the option."""
    ns = build_parser().parse_args(argv)
    o = Options()
    o.nprocs = _positive_int("-n/--nprocs", ns.nprocs)
    o.backends = _names(ns.backend, "--backend")
    for name in o.backends:
        variant_options(name)  # a malformed NAME[key=value] is an error now, not in the ranks
    o.compare = []
    for item in ns.compare:
        for name in _names(item, "--compare"):
            if name not in COMPARES:
                raise InvalidArgumentError(f"--compare {name!r}: choose torch and/or raw")
            if name not in o.compare:
                o.compare.append(name)
    o.ops = parse_ops(ns.op)
    if ns.sizes:
        o.sizes = sorted({parse_size(s) for s in ns.sizes.split(",") if s.strip()})
        if not o.sizes or o.sizes[0] < 1:
            raise InvalidArgumentError(f"--sizes: give positive sizes, got {ns.sizes!r}")
    else:
        try:
            factor = float(ns.factor)
        except ValueError:
            raise InvalidArgumentError(f"--factor must be a number, got {ns.factor!r}") from None
        o.sizes = size_sweep(parse_size(ns.min_bytes), parse_size(ns.max_bytes), factor)
    o.iters = None if ns.iters is None else _positive_int("--iters", ns.iters)
    o.warmup = None if ns.warmup is None else _nonneg_int("--warmup", ns.warmup)
    o.rounds = None if ns.rounds is None else _positive_int("--rounds", ns.rounds)
    o.dtype = ns.dtype
    o.timeout = _seconds("--timeout", ns.timeout)
    o.job_timeout = _seconds("--job-timeout", ns.job_timeout)
    if ns.check is not None and ns.check.strip() not in ("0", "1"):
        raise InvalidArgumentError(f"-c/--check must be 0 or 1, got {ns.check!r}")
    o.check = not ns.no_check and (ns.check is None or ns.check.strip() == "1")
    o.log_busbw = ns.log_busbw
    o.link_rate = None if ns.link_rate is None else parse_link_rate(ns.link_rate)
    o.json, o.csv, o.plot, o.shared_dir = ns.json, ns.csv, ns.plot, ns.shared_dir
    o.progress = not ns.quiet
    o.log_level = ns.log_level.upper()
    if o.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise InvalidArgumentError(f"--log-level {ns.log_level!r}: choose DEBUG, INFO, WARNING or ERROR")
    if o.plot and importlib.util.find_spec("matplotlib") is None:
        raise InvalidArgumentError(f"--plot needs matplotlib, which is not installed: {PLOT_HINT}")
    return o


_RATE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(bit|b|bps)?(/s)?\s*", re.IGNORECASE)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_link_rate(text: str) -> float:
    """A link rate in bytes per second. Bits by default, as links are sold: ``1Gbit``,
    ``100gbit/s``, ``25G``, ``1e9``; bytes with a capital B and ``/s``: ``12.5GB/s``.
    Decimal prefixes (k = 1000), as link rates are quoted."""
    m = _RATE.fullmatch(text)
    if m is None:
        raise InvalidArgumentError(f"--link-rate {text!r}: write a rate such as 1Gbit, 100gbit/s or 12.5GB/s")
    number, prefix, unit, per_s = m.groups()
    value = float(number) * _PREFIX[prefix.lower()]
    in_bytes = unit == "B" and per_s is not None
    rate = value if in_bytes else value / 8
    if not rate > 0:
        raise InvalidArgumentError(f"--link-rate {text!r}: the rate must be positive")
    return rate


def variant_options(name: str) -> tuple[str, dict[str, str]]:
    """``tcp[shm=0;x=y]`` -> ("tcp", {"shm": "0", "x": "y"}); a plain name has no options."""
    base, bracket, rest = name.partition("[")
    if not bracket:
        return name, {}
    pairs = [item.partition("=") for item in rest[:-1].split(";")] if rest.endswith("]") else []
    if not base or not pairs or any(not k.strip() or not eq for k, eq, _ in pairs):
        raise InvalidArgumentError(f"--backend {name!r}: write options as NAME[key=value;key=value]")
    return base, {k.strip(): v.strip() for k, _, v in pairs}


def _names(text: str, option: str) -> list[str]:
    names: list[str] = []
    for raw in str(text).split(","):
        name = raw.strip().lower()
        if name and name not in names:
            names.append(name)
    if not names:
        raise InvalidArgumentError(f"{option}: give at least one name")
    return names


def _nonneg_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a whole number, got {text!r}") from None
    if value < 0:
        raise InvalidArgumentError(f"{name} must not be negative, got {value}")
    return value


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InvalidArgumentError(f"{name} must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise InvalidArgumentError(f"{name} must be positive, got {text!r}")
    return value
