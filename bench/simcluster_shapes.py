"""procgroup-bench on simulated clusters of several shapes (hosts x ranks per host).

Each shape is one simulated cluster (``procgroup.testing.simcluster``: a network and UTS
namespace per host, links of ``--rate`` with ``--delay`` one way) running one job:
``procgroup-run --nnodes H --nproc-per-node K`` on every host, and in it procgroup-bench
with the given variants and torch gloo (``--compare torch``) interleaved round by round,
bus bandwidth also as a fraction of the link (``--link-rate``). Needs root.

    sudo .venv313/bin/python bench/simcluster_shapes.py --shapes 4x2,2x4,4x1,8x1 \\
        --sizes 64K,4M,64M --rounds 3 --out simcluster-shapes

Writes OUT/<shape>.json and .txt per shape and prints one markdown table (every shape,
size and variant: time, busbw, fraction of the link, ratio to torch gloo) at the end;
``--table OUT/*.json`` prints that table again from saved runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _shape(text: str) -> tuple[int, int]:
    hosts, _, per = text.lower().partition("x")
    return int(hosts), int(per or 1)


def run_shape(hosts: int, per: int, args: argparse.Namespace, out: Path) -> Path:
    from procgroup.testing.simcluster import SimCluster

    name = f"{hosts}x{per}"
    result = out / f"{name}.json"
    bench = ["-m", "procgroup.bench", "-B", args.backends, "--compare", "torch", "--op", args.op,
             "--sizes", args.sizes, "--rounds", str(args.rounds), "--link-rate", args.rate, "-q",
             "--timeout", "300", "--json", str(result)]
    if args.iters:
        bench += ["--iters", str(args.iters)]
    with SimCluster(hosts, rate=args.rate, delay=args.delay) as cluster:
        argvs = [[sys.executable, "-m", "procgroup.run", "--nnodes", str(hosts), "--node-rank", str(h.index),
                  "--nproc-per-node", str(per), "--master-addr", cluster.hosts[0].address,
                  "--master-port", "29500", "--no-prefix", "--timeout", "600", *bench]
                 for h in cluster.hosts]
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"# {name}: {hosts} hosts x {per} ranks, {args.rate} links, {args.delay} one way; "
              f"load {' '.join(load)}; {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
        results = cluster.run(argvs, timeout=args.timeout, grace=30)
    text = "".join(r.stdout for r in results)
    (out / f"{name}.txt").write_text(text + "".join(r.stderr for r in results))
    bad = [r for r in results if r.returncode != 0]
    if bad:
        raise SystemExit(f"{name}: host {bad[0].host.index} exit {bad[0].returncode}:\n{bad[0].stderr[-3000:]}")
    print(text, flush=True)
    return result


def table(paths: list[Path]) -> str:
    """One markdown row per (shape, op, size, procgroup variant) with torch gloo beside it."""
    lines = ["| shape | op | size | variant | time | busbw | of the link | torch gloo busbw | of the link | "
             "**variant / gloo** |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for path in paths:
        data: dict[str, Any] = json.loads(path.read_text())
        meta, rows = data["meta"], data["results"]
        shape = (meta.get("topology") or {}).get("shape", path.stem)
        gloo = {(r["op"], r["nbytes"]): r for r in rows if r["variant"] == "torch-gloo" and r["status"] == "ok"}
        for r in rows:
            if r["variant"] == "torch-gloo" or r["status"] != "ok":
                continue
            g = gloo.get((r["op"], r["nbytes"]))
            size = f"{r['nbytes'] >> 20} MiB" if r["nbytes"] >= 1 << 20 else f"{r['nbytes'] >> 10} KiB"
            t = r["time_us"]
            when = f"{t / 1e3:.1f} ms" if t >= 1000 else f"{t:.0f} us"
            ratio = f"**{r['busbw_gbps'] / g['busbw_gbps']:.2f}x**" if g else "-"
            lines.append(
                f"| {shape} | {r['op']} | {size} | {r['variant']} | {when} | {r['busbw_gbps'] * 1e3:.1f} MB/s | "
                f"{r['link_fraction']:.2f} | {g['busbw_gbps'] * 1e3 if g else float('nan'):.1f} MB/s | "
                f"{g['link_fraction'] if g else float('nan'):.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4x2,2x4,4x1,8x1", help="HOSTSxRANKS, comma separated")
    p.add_argument("--backends", default="tcp", help="procgroup-bench -B (e.g. tcp,tcp[two_level=0])")
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--sizes", default="64K,4M,64M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=0, help="iterations per size (default: procgroup-bench's)")
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--delay", default="0.1ms")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default="simcluster-shapes")
    p.add_argument("--table", nargs="*", default=None, metavar="JSON", help="only print the table of saved runs")
    args = p.parse_args()
    if args.table is not None:
        print(table([Path(x) for x in args.table]))
        return 0
    if os.geteuid() != 0:
        print("the simulated cluster needs root (network namespaces): run with sudo", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = [run_shape(*_shape(s), args, out) for s in args.shapes.split(",") if s.strip()]
    print(table(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
