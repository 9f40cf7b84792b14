"""Fit the alpha-beta (latency-bandwidth) model to procgroup-bench runs and extrapolate.

    python bench/alphabeta.py --sim out/sim-*.json [--local out/local-*.json] \
        [--socket out/socket-2ranks.json] [--wire-latency-us 5] [--link-gbit 100]

``--sim``: procgroup-bench JSON files from simulated clusters (one per host count, tcp
variant, all_reduce and broadcast). Each all_reduce point is written as
``T = a*alpha + b*beta`` with the algorithm procgroup's tcp backend runs at that size
(``a`` sequential messages on the critical path, ``b`` bytes each rank moves on it):

* recursive doubling (small): ``a = b/S = log2(p) (+2 when n is not a power of 2)``
* pipelined ring (large): ``a = 2(n-1)``, ``b = 2(n-1)/n * S``
* broadcast, binomial tree (small): see :func:`tree_bcast_terms`
* broadcast, segmented chain (large): ``a = n-1``, ``b = S + (n-2) * segment``, the
  segment as procgroup picks it (:func:`chain_segment`)

The ring's terms do not depend on its segment, and the chain's charge alpha per hop,
not per segment: the model does not show what a smaller segment costs in frames.

``--algorithms`` says which thresholds and segments the measured code had: ``current``
(backends/tcp/procgroup_tcp/_collectives.py today: the ring from 256 KiB on 4+ ranks,
the chain from 2 MiB on 3+, segments of 128-256 KiB on 3+ ranks), ``9563ad5`` (issue
15's socket path as first merged: the ring from 2 MiB on 4+ ranks, the chain on 2 ranks
only, 1 MiB segments everywhere) or ``a78d30d`` (before it: recursive doubling to
64 KiB, then the ring; the tree for every broadcast); ``--chain-min-bytes`` and
``--segment-bytes`` repeat a run's PROCGROUP_TCP_CHAIN_MIN_BYTES and
PROCGROUP_TCP_SEGMENT_BYTES.

and alpha, beta come from least squares on the relative error (every row divided by its
measured time, so 8 B and 64 MiB weigh alike). ``--local``: runs on one host (any
number of ranks), fitted per rank count as ``T = alpha_n + S*beta_n``. ``--socket``: a
2-rank run of the socket path on loopback; its all_reduce gives the fastest rate
one rank's Python socket path reaches here, which bounds beta on fast links (the
all_reduce size with the most bytes per second, 1 MiB or more).

Then the model is evaluated on paper for 64 and 1024 hosts on ``--link-gbit`` links:
alpha = the fitted software part of alpha (alpha minus the simulated wire delay) plus
``--wire-latency-us``; beta = the link's (TCP goodput 95.6 % of its rate) or the host's,
whichever is slower. Printed as Markdown tables for docs/performance.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# The pipelines' segment, mirrored from backends/tcp/procgroup_tcp/_collectives.py (this
# script imports nothing from procgroup): SEGMENT_BYTES on 2 ranks; on 3 or more
# (Plan.segment_for, Plan.chain_segment) the chain's array cut in CHAIN_SEGMENTS_PER_HOP
# segments per hop, each held to MIN_SEGMENT_BYTES..MULTI_SEGMENT_BYTES. The ring's
# segment (RING_SEGMENTS_PER_CHUNK there) is not mirrored: its terms do not use it.
SEGMENT_BYTES = 1 << 20  # procgroup_tcp._collectives.SEGMENT_BYTES
MULTI_SEGMENT_BYTES = 256 * 1024  # procgroup_tcp._collectives.MULTI_SEGMENT_BYTES
MIN_SEGMENT_BYTES = 128 * 1024  # procgroup_tcp._collectives.MIN_SEGMENT_BYTES
CHAIN_SEGMENTS_PER_HOP = 2  # procgroup_tcp._collectives.CHAIN_SEGMENTS_PER_HOP
NEVER = float(1 << 62)


@dataclass(frozen=True)
class Selection:
    """Which algorithm procgroup's tcp socket path runs, by size and world size."""

    name: str
    ring_min: dict[
        int, float
    ]  # all_reduce: the ring from this size (by the largest key <= n)
    chain_min: dict[int, float]  # broadcast: the chain from this size
    # every pipeline's segment, or None for procgroup's rule (see chain_segment)
    segment: int | None = None

    @staticmethod
    def _by_n(table: dict[int, float], n: int) -> float:
        return table[max(k for k in table if k <= n)]

    def ring(self, n: int, nbytes: float) -> bool:
        return nbytes >= self._by_n(self.ring_min, n)

    def chain(self, n: int, nbytes: float) -> bool:
        return nbytes >= self._by_n(self.chain_min, n)


SELECTIONS = {
    "a78d30d": Selection("a78d30d", {1: 64 * 1024 + 1}, {1: NEVER}, SEGMENT_BYTES),
    "9563ad5": Selection(
        "9563ad5", {1: 1 << 20, 4: 2 << 20}, {1: 1 << 20, 3: NEVER}, SEGMENT_BYTES
    ),
    # procgroup_tcp._collectives.RING_MIN_BYTES and BROADCAST_CHAIN_MIN_BYTES (be2e4ff),
    # segments by the rule of f4059f6 and cf55d87
    "current": Selection(
        "current", {1: 1 << 20, 4: 256 * 1024}, {1: 1 << 20, 3: 2 << 20}
    ),
}
GOODPUT = 1448 / 1514  # TCP payload per 1500-MTU Ethernet frame, timestamps on


@dataclass(frozen=True)
class Point:
    op: str
    n: int
    nbytes: int
    seconds: float


def load(paths: Iterable[str], variant: str = "tcp") -> list[Point]:
    points = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        n = int(data["meta"]["world_size"])
        for r in data["results"]:
            if (
                r["variant"] == variant
                and r["status"] == "ok"
                and r["time_us"] is not None
            ):
                points.append(Point(r["op"], n, int(r["nbytes"]), r["time_us"] * 1e-6))
    return points


def rd_steps(n: int) -> int:
    """Messages on the critical path of recursive doubling (with the fold for n != 2^k)."""
    p2 = 1 << (n.bit_length() - 1)
    return int(math.log2(p2)) + (2 if n != p2 else 0)


def all_reduce_terms(n: int, nbytes: float, sel: Selection) -> tuple[float, float, str]:
    """(a, b, algorithm) of procgroup's tcp all_reduce: T = a*alpha + b*beta."""
    if not sel.ring(n, nbytes):
        k = rd_steps(n)
        return k, k * nbytes, "recursive doubling"
    return 2 * (n - 1), 2 * (n - 1) / n * nbytes, "pipelined ring"


def ring_terms(n: int, nbytes: float) -> tuple[float, float]:
    return 2 * (n - 1), 2 * (n - 1) / n * nbytes


def rd_terms(n: int, nbytes: float) -> tuple[float, float]:
    k = rd_steps(n)
    return k, k * nbytes


def rabenseifner_terms(n: int, nbytes: float) -> tuple[float, float]:
    """Reduce-scatter by recursive halving, all-gather by recursive doubling (not in procgroup)."""
    k = math.ceil(math.log2(n))
    return 2 * k, 2 * (n - 1) / n * nbytes


def tree_children(vr: int, n: int) -> list[int]:
    """Children of virtual rank ``vr`` in procgroup's binomial-tree broadcast (algorithms/tree.py)."""
    mask = 1
    while mask < n and not vr & mask:
        mask <<= 1
    mask >>= 1
    out = []
    while mask > 0:
        if vr + mask < n:
            out.append(vr + mask)
        mask >>= 1
    return out


def tree_bcast_terms(n: int, nbytes: float) -> tuple[float, float]:
    """procgroup's binomial-tree broadcast: the whole message down ceil(log2 n) levels.

    A parent sends to all its children at once (isend), so they share its uplink: c
    children all have the message c*S*beta after their parent had it. The critical path
    is the latest rank: for n = 2^k that is k(k+1)/2 * S * beta, not k * S * beta.
    """
    done = {0: (0, 0.0)}  # virtual rank -> (levels, bytes on its path)
    todo = [0]
    while todo:
        vr = todo.pop()
        kids = tree_children(vr, n)
        levels, moved = done[vr]
        for kid in kids:
            done[kid] = (levels + 1, moved + len(kids) * nbytes)
            todo.append(kid)
    return max(done.values(), key=lambda t: (t[1], t[0]))


def chain_segment(n: int, nbytes: float, fixed: int | None = None) -> float:
    """The segment of procgroup's chain (``Plan.chain_segment``): ``fixed`` when set (a
    PROCGROUP_TCP_SEGMENT_BYTES, or the 1 MiB of the code before f4059f6); else 1 MiB on
    2 ranks, and on 3 or more the array / (2 (n-1)), held to 128-256 KiB."""
    if fixed is not None:
        return fixed
    if n <= 2:
        return SEGMENT_BYTES
    pieces = CHAIN_SEGMENTS_PER_HOP * (n - 1)
    return min(MULTI_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, math.ceil(nbytes / pieces)))


def chain_bcast_terms(
    n: int, nbytes: float, segment: int | None = None
) -> tuple[float, float]:
    """procgroup's segmented chain: n-1 hops, the array once plus n-2 segments in flight."""
    seg = chain_segment(n, nbytes, segment)
    return n - 1, nbytes + (n - 2) * min(seg, nbytes)


def bcast_terms(n: int, nbytes: float, sel: Selection) -> tuple[float, float, str]:
    if sel.chain(n, nbytes):
        return (*chain_bcast_terms(n, nbytes, sel.segment), "chain")
    return (*tree_bcast_terms(n, nbytes), "binomial tree")


def scatter_allgather_bcast_terms(n: int, nbytes: float) -> tuple[float, float]:
    """Broadcast as a binomial scatter then a ring all-gather (van de Geijn; not in procgroup)."""
    return math.ceil(math.log2(n)) + n - 1, 2 * (n - 1) / n * nbytes


def fit(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """alpha, beta minimising the relative error of T = a*alpha + b*beta over (a, b, T) rows."""
    a = np.array([[r[0] / r[2], r[1] / r[2]] for r in rows])
    y = np.ones(len(rows))
    (alpha, beta), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(alpha), float(beta)


def fmt_time(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return (
                f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
            )
    return f"{nbytes:.0f} B"


def report_sim(
    points: list[Point], delay_s: float, sel: Selection
) -> tuple[float, float]:
    ar = [p for p in points if p.op == "all_reduce"]
    alpha, beta = fit(
        [(*all_reduce_terms(p.n, p.nbytes, sel)[:2], p.seconds) for p in ar]
    )
    print(
        f"## Simulated cluster, all_reduce ({sel.name}): alpha = {alpha * 1e6:.1f} us, "
        f"beta = {beta * 1e9:.3f} ns/B ({1 / beta / 1e6:.1f} MB/s); "
        f"software part of alpha = {(alpha - delay_s) * 1e6:.1f} us\n"
    )
    print("| hosts | size | algorithm | measured | model | model / measured |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for p in sorted(ar, key=lambda p: (p.n, p.nbytes)):
        a, b, algo = all_reduce_terms(p.n, p.nbytes, sel)
        model = a * alpha + b * beta
        print(
            f"| {p.n} | {fmt_size(p.nbytes)} | {algo} | {fmt_time(p.seconds)} | "
            f"{fmt_time(model)} | {model / p.seconds:.2f} |"
        )
    bc = [p for p in points if p.op == "broadcast"]
    if bc:
        b_alpha, b_beta = fit(
            [(*bcast_terms(p.n, p.nbytes, sel)[:2], p.seconds) for p in bc]
        )
        print(
            f"\n## Simulated cluster, broadcast ({sel.name}, own fit): alpha = {b_alpha * 1e6:.1f} us, "
            f"beta = {b_beta * 1e9:.3f} ns/B ({1 / b_beta / 1e6:.1f} MB/s)\n"
        )
        print("| hosts | size | algorithm | measured | model | model / measured |")
        print("| ---: | ---: | --- | ---: | ---: | ---: |")
        for p in sorted(bc, key=lambda p: (p.n, p.nbytes)):
            a, b, algo = bcast_terms(p.n, p.nbytes, sel)
            model = a * b_alpha + b * b_beta
            print(
                f"| {p.n} | {fmt_size(p.nbytes)} | {algo} | {fmt_time(p.seconds)} | "
                f"{fmt_time(model)} | {model / p.seconds:.2f} |"
            )
    print()
    return alpha, beta


def report_local(points: list[Point]) -> None:
    ar = [p for p in points if p.op == "all_reduce"]
    print(
        "## One host, all_reduce (shared-memory arena): T = alpha_n + S * beta_n per rank count\n"
    )
    print("| ranks | alpha_n | beta_n (ns/B) | 1/beta_n |")
    print("| ---: | ---: | ---: | ---: |")
    for n in sorted({p.n for p in ar}):
        rows = [(1.0, float(p.nbytes), p.seconds) for p in ar if p.n == n]
        if len(rows) < 2:
            continue
        alpha, beta = fit(rows)
        print(
            f"| {n} | {alpha * 1e6:.1f} us | {beta * 1e9:.3f} | {1 / beta / 1e9:.2f} GB/s |"
        )
    print()


def predict(
    alpha: float,
    beta_link: float,
    beta_host: float | None,
    link_gbit: float,
    sel: Selection,
) -> None:
    sizes = [8, 64 << 10, 4 << 20, 64 << 20]
    betas = [("link-limited", beta_link)]
    if beta_host is not None and beta_host > beta_link:
        betas.append(("host-limited (today's socket path)", beta_host))
    for label, beta in betas:

        def t(terms: tuple[Any, ...], beta: float = beta) -> str:
            return fmt_time(terms[0] * alpha + terms[1] * beta)

        print(
            f"## On paper ({sel.name}): {link_gbit:g} Gbit/s links, alpha = {alpha * 1e6:.1f} us, "
            f"1/beta = {1 / beta / 1e9:.2f} GB/s ({label})\n"
        )
        print(
            "| hosts | size | procgroup all_reduce | time | recursive doubling | pipelined ring | Rabenseifner "
            "| procgroup broadcast | time | binomial tree | chain | scatter + all-gather |"
        )
        print(
            "| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
        )
        for n in (64, 1024):
            for s in sizes:
                ar = all_reduce_terms(n, s, sel)
                bc = bcast_terms(n, s, sel)
                print(
                    f"| {n} | {fmt_size(s)} | {ar[2]} | {t(ar)} | {t(rd_terms(n, s))} | {t(ring_terms(n, s))} | "
                    f"{t(rabenseifner_terms(n, s))} | {bc[2]} | {t(bc)} | {t(tree_bcast_terms(n, s))} | "
                    f"{t(chain_bcast_terms(n, s, sel.segment))} | "
                    f"{t(scatter_allgather_bcast_terms(n, s))} |"
                )
        for n in (64, 1024):
            a_rd, b_rd = rd_terms(n, 1.0)
            a_ring, b_ring = ring_terms(n, 1.0)
            cross = (
                (a_ring - a_rd) * alpha / ((b_rd - b_ring) * beta)
                if b_rd > b_ring
                else math.inf
            )
            where = fmt_size(cross) if math.isfinite(cross) else "any size"
            switch = fmt_size(Selection._by_n(sel.ring_min, n))
            print(
                f"\nn = {n}: recursive doubling beats the ring below {where} (procgroup switches at {switch})"
            )
        print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sim",
        nargs="+",
        required=True,
        help="procgroup-bench JSON of simulated clusters",
    )
    p.add_argument(
        "--sim-delay-us",
        type=float,
        default=100.0,
        help="one-way delay of the simulated links",
    )
    p.add_argument(
        "--local", nargs="*", default=[], help="procgroup-bench JSON of one-host runs"
    )
    p.add_argument(
        "--socket",
        help="procgroup-bench JSON of a 2-rank socket-path run (PROCGROUP_TCP_SHM=0)",
    )
    p.add_argument(
        "--wire-latency-us",
        type=float,
        default=5.0,
        help="one-way network latency assumed on paper",
    )
    p.add_argument("--link-gbit", type=float, default=100.0)
    p.add_argument(
        "--algorithms",
        choices=sorted(SELECTIONS),
        default="current",
        help="the thresholds and segments of the code that was measured (current)",
    )
    p.add_argument(
        "--chain-min-bytes", type=float, help="PROCGROUP_TCP_CHAIN_MIN_BYTES of the run"
    )
    p.add_argument(
        "--segment-bytes",
        type=int,
        help="PROCGROUP_TCP_SEGMENT_BYTES of the run (every pipeline's segment)",
    )
    args = p.parse_args()
    sel = SELECTIONS[args.algorithms]
    if args.chain_min_bytes is not None:
        sel = dataclasses.replace(
            sel,
            name=f"{sel.name}, chain from {fmt_size(args.chain_min_bytes)}",
            chain_min={1: args.chain_min_bytes},
        )
    if args.segment_bytes is not None:
        if args.segment_bytes < 1:
            p.error("--segment-bytes: a segment needs at least one byte")
        sel = dataclasses.replace(
            sel,
            name=f"{sel.name}, {fmt_size(args.segment_bytes)} segments",
            segment=args.segment_bytes,
        )
    delay = args.sim_delay_us * 1e-6
    alpha, _beta = report_sim(load(args.sim), delay, sel)
    if args.local:
        report_local(load(args.local))
    beta_host = None
    if args.socket:
        candidates = [
            q
            for q in load([args.socket])
            if q.op == "all_reduce" and q.nbytes >= 1 << 20
        ]
        best = min(
            candidates,
            key=lambda q: q.seconds / all_reduce_terms(q.n, q.nbytes, sel)[1],
        )
        beta_host = best.seconds / all_reduce_terms(best.n, best.nbytes, sel)[1]
        print(
            f"socket path on loopback, {best.n} ranks, fastest all_reduce per byte: {fmt_size(best.nbytes)} in "
            f"{fmt_time(best.seconds)}, 1/beta = {1 / beta_host / 1e9:.2f} GB/s per rank\n"
        )
    alpha_paper = max(alpha - delay, 0.0) + args.wire_latency_us * 1e-6
    beta_link = 1 / (args.link_gbit * 1e9 / 8 * GOODPUT)
    predict(
        alpha_paper, beta_link, beta_host, args.link_gbit, SELECTIONS[args.algorithms]
    )


if __name__ == "__main__":
    main()
