"""Results: one record per (op, size, variant), the table, JSON and CSV."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, TextIO

from ._sweep import OPS, format_size


def describe_topology(topo: dict[str, Any]) -> str:
    """"4 hosts x 2 ranks per host", "3 hosts x (1, 3, 2) ranks"."""
    hosts, counts = topo["hosts"], topo["ranks_per_host"]
    what = f"{hosts} host{'s' if hosts != 1 else ''}"
    if all(c == counts[0] for c in counts):
        return f"{what} x {counts[0]} rank{'s' if counts[0] != 1 else ''} per host"
    return f"{what} x ({', '.join(map(str, counts))}) ranks"


@dataclass
class Record:
    """One measured point. Times in microseconds, bandwidths in GB/s (1e9 B/s)."""

    op: str
    variant: str
    world_size: int
    nbytes: int
    count: int
    dtype: str
    iters: int
    warmup: int
    time_us: float  # median over iterations of the per-iteration time (see docs)
    min_us: float
    max_us: float
    algbw_gbps: float
    busbw_gbps: float
    ratio: float  # time_us / time_us of the reference (first) variant at this op and size
    status: str = "ok"  # "ok", or why this point has no numbers
    #: busbw / the link rate given with --link-rate (NaN without one)
    link_fraction: float = math.nan

    @property
    def place(self) -> str:
        """nccl-tests' in-place/out-of-place: "in" when the op writes its input buffer."""
        return "in" if self.op in IN_PLACE else "out"


#: Ops whose output is their input buffer (all_reduce, broadcast, reduce); the others
#: write separate output arrays, nccl-tests' "out-of-place".
IN_PLACE = frozenset({"all_reduce", "broadcast", "reduce"})
#: Written after the Record's fields: "in"/"out" of place, and nccl-tests' #wrong (0 when
#: the op's first call was checked and agreed; None/empty when --no-check).
EXTRA_COLUMNS = ["place", "wrong"]
COLUMNS = [f.name for f in fields(Record)] + EXTRA_COLUMNS


def fill_ratios(records: list[Record], reference: str) -> None:
    """Set ``ratio`` = time / reference's time at the same (op, size); NaN where undefined."""
    ref = {(r.op, r.nbytes): r.time_us for r in records if r.variant == reference and r.status == "ok"}
    for r in records:
        base = ref.get((r.op, r.nbytes))
        r.ratio = r.time_us / base if r.status == "ok" and base is not None and base > 0 else math.nan


def _wrong(r: Record, meta: dict[str, Any]) -> int | None:
    """nccl-tests' #wrong: 0 for a checked point that ran (a failed check ends the point
    with a status instead of numbers); None when nothing was checked."""
    return 0 if meta.get("check", True) and r.status == "ok" else None


def _num(x: float, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def print_table(records: list[Record], meta: dict[str, Any], out: TextIO) -> None:
    """nccl-tests-like table, one block per op."""
    out.write(f"# procgroup-bench: {meta['world_size']} ranks, dtype {meta['dtype']}, "
              f"variants {', '.join(meta['variants'])} (ratio = time / time of {meta['reference']})\n")
    out.write("# time = median over iterations of the slowest rank's time for that iteration "
              "(pingpong: half of rank 0's round trip)\n")
    topo = meta.get("topology")
    if topo:
        out.write(f"# topology: {describe_topology(topo)} (shape {topo['shape']})\n")
    rate = meta.get("link_rate_Bps")
    if rate:
        out.write(f"# link = busbw / the link rate ({rate * 8 / 1e9:g} Gbit/s = {rate / 1e9:g} GB/s)\n")
    for op in OPS:
        rows = [r for r in records if r.op == op]
        if not rows:
            continue
        out.write(f"\n## {op} (busbw factor {OPS[op].bus_factor(meta['world_size']):.3g})\n")
        out.write(f"{'size':>10}  {'variant':<12} {'place':>5} {'iters':>5} {'time(us)':>11} {'min(us)':>11} "
                  f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6} {'ratio':>6}"
                  f"{' link' if rate else ''}\n")
        for r in rows:
            if r.status != "ok":
                out.write(f"{format_size(r.nbytes):>10}  {r.variant:<12} {r.place + '-of':>5} {'':>5} n/a: {r.status}\n")
                continue
            wrong = _wrong(r, meta)
            out.write(f"{format_size(r.nbytes):>10}  {r.variant:<12} {r.place:>5} {r.iters:>5} {_num(r.time_us, '11.2f')} "
                      f"{_num(r.min_us, '11.2f')} {_num(r.algbw_gbps, '11.4f')} {_num(r.busbw_gbps, '11.4f')} "
                      f"{'N/A' if wrong is None else wrong:>6} {_num(r.ratio, '6.2f')}"
                      f"{' ' + _num(r.link_fraction, '5.2f') if rate else ''}\n")
        for variant in dict.fromkeys(r.variant for r in rows):
            bws = [r.busbw_gbps for r in rows if r.variant == variant and r.status == "ok"
                   and not math.isnan(r.busbw_gbps)]
            if bws:
                out.write(f"# {variant}: Avg bus bandwidth    : {sum(bws) / len(bws):.4f} GB/s "
                          f"({len(bws)} sizes, {op}, {'in' if op in IN_PLACE else 'out-of'}-place)\n")
    wrong_total = [_wrong(r, meta) for r in records if r.status == "ok"]
    if wrong_total and all(w is not None for w in wrong_total):
        out.write(f"\n# Out of bounds values : {sum(w or 0 for w in wrong_total)} OK\n")
    ok = [r.busbw_gbps for r in records if r.status == "ok" and not math.isnan(r.busbw_gbps)]
    if ok:
        out.write(f"# Avg bus bandwidth    : {sum(ok) / len(ok):.4f} GB/s (every op, size and variant)\n")
    notes = meta.get("notes") or []
    if notes:
        out.write("\n")
        out.writelines(f"# note: {note}\n" for note in notes)
    out.flush()


def _jsonable(x: Any) -> Any:
    """JSON values: NaN -> null, numbers kept as numbers (numpy scalars too), numeric
    strings (a count, a size) as numbers."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalar
        return _jsonable(x.item())
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def real_versions(versions: dict[str, Any]) -> dict[str, str]:
    """Fill in versions a module did not say ("?": pygloo has no __version__) from the
    installed distribution's metadata."""
    from importlib import metadata

    out = {}
    for name, value in versions.items():
        if value in (None, "", "?"):
            try:
                value = metadata.version({"cupy": "cupy-cuda12x"}.get(name, name))
            except metadata.PackageNotFoundError:
                value = "unknown"
        out[name] = str(value)
    return out


def _row(r: Record, meta: dict[str, Any]) -> dict[str, Any]:
    row = asdict(r)
    row["place"] = r.place
    row["wrong"] = _wrong(r, meta)
    return row


def write_json(path: str, records: Iterable[Record], meta: dict[str, Any]) -> None:
    meta = dict(meta)
    if isinstance(meta.get("versions"), dict):
        meta["versions"] = real_versions(meta["versions"])
    data = {"meta": _jsonable(meta), "columns": COLUMNS,
            "results": [{k: _jsonable(v) for k, v in _row(r, meta).items()} for r in records]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, allow_nan=False)
        f.write("\n")


#: CSV precision: times to 0.01 us, bandwidths to 0.0001 GB/s, ratios to 0.001.
_ROUND = {"time_us": 2, "min_us": 2, "max_us": 2, "algbw_gbps": 4, "busbw_gbps": 4, "ratio": 3, "link_fraction": 4}


def _csv_value(key: str, v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return round(v, _ROUND.get(key, 6))
    return "" if v is None else v


def write_csv(path: str, records: Iterable[Record], meta: dict[str, Any] | None = None) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in records:
            w.writerow({k: _csv_value(k, v) for k, v in _row(r, meta or {}).items()})
