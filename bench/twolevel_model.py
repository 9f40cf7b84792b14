"""The two-level all_reduce model, fitted to procgroup-bench runs on simulated clusters.

    python bench/twolevel_model.py simcluster-shapes/*.json [--variant tcp] [--predict 64x8]
        [--link-rate 100gbit] [--stream-rate 1.6e9] [--no-overlap]

Alpha-beta terms per level, in the algorithms' own structure (``procgroup_tcp._collectives``
picks which applies, by topology and size):

- inside a host (shared-memory point to point): ``a_host`` per phase (up to the leaders,
  back down), ``b_host`` per byte a rank moves (its contributions up, the results down,
  the reduction folded in);
- between hosts (sockets): ``a_net`` per step of the between-host algorithm (a ring's
  2(H-1) steps, or recursive doubling's log2 H), ``b_net`` per byte crossing one host's
  link (the link is shared by the host's leaders: its bytes are the same whatever L).

Sliced (all_reduce >= SLICED_MIN_BYTES, L ranks per host each leading S/L):
    T = 2 a_host + 2 S (L-1)/L b_host + 2(H-1) a_net + 2 S (H-1)/H b_net
Streamed (slices of STREAMED_MIN_BYTES and more, on the ring): the host stage rides on
the ring's H chunks, so only the first chunk's comes before the ring and the last one's
after it: the b_host term shrinks to 2 S (L-1)/(L H) (``--no-overlap`` keeps the whole
term, as if the host stage ran beside the ring on no spare core).
One leader per host (smaller): T = 2 a_host + 2 S (L-1) b_host + [inter of S over H]
One rank per host (flat): only the between-host term.

The four coefficients are fitted by least squares on relative error over every measured
point (hosts x ranks per host x size). The prediction for another cluster scales
``b_net`` to its link rate, bounded below by the host's own limit on one socket stream
(``--stream-rate``; the L leaders of a host run L streams at once), and keeps the fitted
``a_net`` and host terms (measured here: conservative for a real cluster's hosts).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: procgroup_tcp._collectives: sliced from this size; the flat ring from RING_MIN by size
SLICED_MIN_BYTES = 512 * 1024
STREAMED_MIN_BYTES = 8 << 20
RING_MIN_BYTES = {2: 1 << 20, 3: 1 << 20, 4: 256 * 1024}
NAMES = ("a_host", "b_host", "a_net", "b_net")


def _ring_min(n: int) -> int:
    return RING_MIN_BYTES[max(k for k in RING_MIN_BYTES if k <= n)] if n >= 2 else 0


def _inter(h: int, s: float) -> tuple[float, float]:
    """(steps, bytes over one host's link) of the flat all_reduce of s bytes over h ranks."""
    if h <= 1:
        return 0.0, 0.0
    if s >= _ring_min(h):
        return 2.0 * (h - 1), 2.0 * s * (h - 1) / h
    rounds = math.ceil(math.log2(h))
    return float(rounds), rounds * s


def features(h: int, local: int, s: float, overlap: bool = True) -> list[float]:
    """The coefficients of (a_host, b_host, a_net, b_net) in T for this shape and size
    (``overlap``: the streamed ring hides the host stage but for its first and last chunk)."""
    if local <= 1:
        steps, wire = _inter(h, s)
        return [0.0, 0.0, steps, wire]
    if h <= 1:
        raise ValueError("one host: the shared-memory arena, not this model")
    if s >= SLICED_MIN_BYTES:
        part = s / local
        steps, wire = _inter(h, part)
        host = 2.0 * s * (local - 1) / local
        if overlap and part >= STREAMED_MIN_BYTES and part >= _ring_min(h):
            host /= h
        return [2.0, host, steps, wire * local]
    steps, wire = _inter(h, s)
    return [2.0, 2.0 * s * (local - 1), steps, wire]


def load(paths: list[str], variant: str) -> list[tuple[int, int, int, float]]:
    """(hosts, ranks per host, bytes, seconds) of every ok all_reduce point of ``variant``."""
    points = []
    for path in paths:
        data: dict[str, Any] = json.loads(Path(path).read_text())
        topo = data["meta"].get("topology") or {}
        counts = topo.get("ranks_per_host") or []
        if not counts or len(set(counts)) != 1:
            continue
        for r in data["results"]:
            if r["op"] == "all_reduce" and r["variant"] == variant and r["status"] == "ok":
                points.append((len(counts), counts[0], int(r["nbytes"]), r["time_us"] / 1e6))
    return points


def fit(points: list[tuple[int, int, int, float]], overlap: bool = True) -> np.ndarray:
    """Least squares on relative error; a coefficient that comes out negative is dropped."""
    rows = np.array([features(h, local, s, overlap) for h, local, s, _ in points])
    times = np.array([t for *_, t in points])
    keep = list(range(rows.shape[1]))
    while True:
        a = rows[:, keep] / times[:, None]
        coef, *_ = np.linalg.lstsq(a, np.ones(len(times)), rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            out = np.zeros(rows.shape[1])
            out[keep] = np.clip(coef, 0, None)
            return out
        keep.pop(int(np.argmin(coef)))


def busbw(h: int, local: int, s: float, t: float) -> float:
    n = h * local
    return s / t * 2 * (n - 1) / n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+")
    p.add_argument("--variant", default="tcp")
    p.add_argument("--predict", default="64x8", help="HOSTSxRANKS to predict")
    p.add_argument("--link-rate", default="100gbit", help="the predicted cluster's links")
    p.add_argument("--measured-link", default="1gbit", help="the links the runs were measured on")
    p.add_argument("--stream-rate", type=float, default=1.6e9,
                   help="bytes/s one rank's socket stream carries at most (docs/performance.md)")
    p.add_argument("--a-net", type=float, default=None, metavar="US",
                   help="prediction only: this per-step cost between hosts (microseconds) instead of the fitted one")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="model the streamed ring's host stage as not overlapped (the whole b_host term)")
    args = p.parse_args()
    from procgroup.bench._options import parse_link_rate

    points = load(args.json, args.variant)
    if len(points) < 4:
        print(f"need at least 4 points, found {len(points)}", file=sys.stderr)
        return 2
    coef = fit(points, args.overlap)
    errors = []
    print("| coefficient | fitted |\n|---|---:|")
    units = {"a_host": 1e6, "a_net": 1e6, "b_host": 1e9, "b_net": 1e9}
    for name, c in zip(NAMES, coef):
        if name.startswith("a_"):
            print(f"| {name} | {c * units[name]:.1f} us |")
        else:
            print(f"| {name} | {c * units[name]:.3f} ns/B ({1 / c / 1e6 if c else math.inf:.0f} MB/s) |")
    print("\n| shape | size | measured | model | error |\n|---|---:|---:|---:|---:|")
    for h, local, s, t in sorted(points):
        m = float(np.dot(features(h, local, s, args.overlap), coef))
        errors.append(abs(m - t) / t)
        print(f"| {h}x{local} | {_size(s)} | {t * 1e3:.1f} ms | {m * 1e3:.1f} ms | {100 * (m - t) / t:+.0f} % |")
    print(f"\n{len(points)} points, relative error: mean {100 * np.mean(errors):.0f} %, "
          f"largest {100 * max(errors):.0f} % ({'streamed ring overlapped' if args.overlap else 'no overlap'})")
    measured = parse_link_rate(args.measured_link)
    target = parse_link_rate(args.link_rate)
    h, _, local_text = args.predict.partition("x")
    hosts, local = int(h), int(local_text or 1)
    efficiency = (1 / coef[3]) / measured if coef[3] else 1.0
    b_net = max(1 / (efficiency * target), 1 / (max(local, 1) * args.stream_rate))
    pred = coef.copy()
    pred[3] = b_net
    if args.a_net is not None:
        pred[2] = args.a_net / 1e6
    print(f"\nPrediction for {hosts} hosts x {local} ranks on {args.link_rate} links: link efficiency "
          f"{efficiency:.2f} (fitted), b_net {b_net * 1e9:.4f} ns/B ({1 / b_net / 1e9:.2f} GB/s per host, "
          f"the {'link' if 1 / (efficiency * target) >= 1 / (local * args.stream_rate) else 'hosts streams'} "
          f"limits){'' if args.a_net is None else f'; a_net {args.a_net:g} us (given, not fitted)'}\n")
    print("| size | time | busbw | of the link | network terms only: time, of the link | "
          "one flat ring over all ranks: time |")
    print("|---:|---:|---:|---:|---:|---:|")
    for s in (64 << 10, 4 << 20, 64 << 20, 1 << 30):
        f = features(hosts, local, s, args.overlap)
        t = float(np.dot(f, pred))
        net = float(np.dot(f[2:], pred[2:]))
        flat = pred.copy()
        flat[3] = max(1 / (efficiency * target), 1 / args.stream_rate)  # one stream per host
        tf = float(np.dot(features(hosts * local, 1, s), flat))
        bw = busbw(hosts, local, s, t)
        print(f"| {_size(s)} | {t * 1e3:.2f} ms | {bw / 1e9:.2f} GB/s | {bw / target:.2f} | {net * 1e3:.2f} ms, "
              f"{busbw(hosts, local, s, net) / target:.2f} | {tf * 1e3:.2f} ms |")
    return 0


def _size(s: float) -> str:
    s = int(s)
    return f"{s >> 30} GiB" if s >= 1 << 30 else f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"


if __name__ == "__main__":
    sys.exit(main())
