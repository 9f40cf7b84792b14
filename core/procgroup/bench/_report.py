"""Results: one record per (op, size, variant), the table, JSON and CSV."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, TextIO

from ._sweep import OPS, format_size


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


COLUMNS = [f.name for f in fields(Record)]


def fill_ratios(records: list[Record], reference: str) -> None:
    """Set ``ratio`` = time / reference's time at the same (op, size); NaN where undefined."""
    ref = {(r.op, r.nbytes): r.time_us for r in records if r.variant == reference and r.status == "ok"}
    for r in records:
        base = ref.get((r.op, r.nbytes))
        r.ratio = r.time_us / base if r.status == "ok" and base is not None and base > 0 else math.nan


def _num(x: float, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def print_table(records: list[Record], meta: dict[str, Any], out: TextIO) -> None:
    """nccl-tests-like table, one block per op."""
    out.write(f"# procgroup-bench: {meta['world_size']} ranks, dtype {meta['dtype']}, "
              f"variants {', '.join(meta['variants'])} (ratio = time / time of {meta['reference']})\n")
    out.write("# time = median over iterations of the slowest rank's time for that iteration "
              "(pingpong: half of rank 0's round trip)\n")
    for op in OPS:
        rows = [r for r in records if r.op == op]
        if not rows:
            continue
        out.write(f"\n## {op} (busbw factor {OPS[op].bus_factor(meta['world_size']):.3g})\n")
        out.write(f"{'size':>10}  {'variant':<12} {'iters':>5} {'time(us)':>11} {'min(us)':>11} "
                  f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'ratio':>6}\n")
        for r in rows:
            if r.status != "ok":
                out.write(f"{format_size(r.nbytes):>10}  {r.variant:<12} {'':>5} n/a: {r.status}\n")
                continue
            out.write(f"{format_size(r.nbytes):>10}  {r.variant:<12} {r.iters:>5} {_num(r.time_us, '11.2f')} "
                      f"{_num(r.min_us, '11.2f')} {_num(r.algbw_gbps, '11.4f')} {_num(r.busbw_gbps, '11.4f')} "
                      f"{_num(r.ratio, '6.2f')}\n")
    notes = meta.get("notes") or []
    if notes:
        out.write("\n")
        out.writelines(f"# note: {note}\n" for note in notes)
    out.flush()


def _jsonable(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def write_json(path: str, records: Iterable[Record], meta: dict[str, Any]) -> None:
    data = {"meta": meta, "columns": COLUMNS,
            "results": [{k: _jsonable(v) for k, v in asdict(r).items()} for r in records]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def write_csv(path: str, records: Iterable[Record]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in records:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(r).items()})
