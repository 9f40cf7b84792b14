"""Fit the alpha-beta (latency-bandwidth) model to procgroup-bench runs and extrapolate.

    python bench/alphabeta.py --sim out/sim-*.json [--local out/local-*.json] \
        [--socket out/socket-2ranks.json] [--wire-latency-us 5] [--link-gbit 100]

``--sim``: procgroup-bench JSON files from simulated clusters (one per host count, tcp
variant, all_reduce and broadcast). Each all_reduce point is written as
``T = a*alpha + b*beta`` with the algorithm procgroup's tcp backend runs at that size
(``a`` sequential messages on the critical path, ``b`` bytes each rank moves on it):

* recursive doubling (<= 64 KiB): ``a = b/S = log2(p) (+2 when n is not a power of 2)``
* pipelined ring (> 64 KiB): ``a = 2(n-1)``, ``b = 2(n-1)/n * S``

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
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SMALL_ALL_REDUCE_BYTES = (
    64 * 1024
)  # procgroup.algorithms.ring: recursive doubling at or below
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


def all_reduce_terms(
    n: int, nbytes: float, threshold: float = SMALL_ALL_REDUCE_BYTES
) -> tuple[float, float, str]:
    """(a, b, algorithm) of procgroup's tcp all_reduce: T = a*alpha + b*beta."""
    if nbytes <= threshold:
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


def report_sim(points: list[Point], delay_s: float) -> tuple[float, float]:
    ar = [p for p in points if p.op == "all_reduce"]
    rows = []
    for p in ar:
        a, b, _ = all_reduce_terms(p.n, p.nbytes)
        rows.append((a, b, p.seconds))
    alpha, beta = fit(rows)
    print(
        f"## Simulated cluster, all_reduce: alpha = {alpha * 1e6:.1f} us, beta = {beta * 1e9:.3f} ns/B "
        f"({1 / beta / 1e6:.1f} MB/s); software part of alpha = {(alpha - delay_s) * 1e6:.1f} us\n"
    )
    print("| hosts | size | algorithm | measured | model | model / measured |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for p in sorted(ar, key=lambda p: (p.n, p.nbytes)):
        a, b, algo = all_reduce_terms(p.n, p.nbytes)
        model = a * alpha + b * beta
        print(
            f"| {p.n} | {fmt_size(p.nbytes)} | {algo} | {fmt_time(p.seconds)} | {fmt_time(model)} | "
            f"{model / p.seconds:.2f} |"
        )
    bc = [p for p in points if p.op == "broadcast"]
    if bc:
        b_alpha, b_beta = fit(
            [(*tree_bcast_terms(p.n, p.nbytes), p.seconds) for p in bc]
        )
        print(
            f"\n## Simulated cluster, broadcast (binomial tree, own fit): alpha = {b_alpha * 1e6:.1f} us, "
            f"beta = {b_beta * 1e9:.3f} ns/B ({1 / b_beta / 1e6:.1f} MB/s)\n"
        )
        print("| hosts | size | measured | model | model / measured |")
        print("| ---: | ---: | ---: | ---: | ---: |")
        for p in sorted(bc, key=lambda p: (p.n, p.nbytes)):
            a, b = tree_bcast_terms(p.n, p.nbytes)
            model = a * b_alpha + b * b_beta
            print(
                f"| {p.n} | {fmt_size(p.nbytes)} | {fmt_time(p.seconds)} | {fmt_time(model)} | "
                f"{model / p.seconds:.2f} |"
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
    alpha: float, beta_link: float, beta_host: float | None, link_gbit: float
) -> None:
    sizes = [8, 64 << 10, 4 << 20, 64 << 20]
    betas = [("link-limited", beta_link)]
    if beta_host is not None and beta_host > beta_link:
        betas.append(("host-limited (today's socket path)", beta_host))
    for label, beta in betas:
        print(
            f"## On paper: {link_gbit:g} Gbit/s links, alpha = {alpha * 1e6:.1f} us, "
            f"1/beta = {1 / beta / 1e9:.2f} GB/s ({label})\n"
        )
        print(
            "| hosts | size | procgroup all_reduce today | time | recursive doubling | pipelined ring | "
            "Rabenseifner | broadcast (binomial tree) | broadcast (scatter + all-gather) |"
        )
        print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n in (64, 1024):
            for s in sizes:
                a, b, algo = all_reduce_terms(n, s)

                def t(terms: tuple[float, float], beta: float = beta) -> str:
                    return fmt_time(terms[0] * alpha + terms[1] * beta)

                print(
                    f"| {n} | {fmt_size(s)} | {algo} | {fmt_time(a * alpha + b * beta)} | {t(rd_terms(n, s))} | "
                    f"{t(ring_terms(n, s))} | {t(rabenseifner_terms(n, s))} | {t(tree_bcast_terms(n, s))} | "
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
            print(
                f"\nn = {n}: recursive doubling beats the ring below {where} (procgroup switches at 64 KiB)"
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
    args = p.parse_args()
    delay = args.sim_delay_us * 1e-6
    alpha, _beta = report_sim(load(args.sim), delay)
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
            candidates, key=lambda q: q.seconds / all_reduce_terms(q.n, q.nbytes)[1]
        )
        beta_host = best.seconds / all_reduce_terms(best.n, best.nbytes)[1]
        print(
            f"socket path on loopback, {best.n} ranks, fastest all_reduce per byte: {fmt_size(best.nbytes)} in "
            f"{fmt_time(best.seconds)}, 1/beta = {1 / beta_host / 1e9:.2f} GB/s per rank\n"
        )
    alpha_paper = max(alpha - delay, 0.0) + args.wire_latency_us * 1e-6
    beta_link = 1 / (args.link_gbit * 1e9 / 8 * GOODPUT)
    predict(alpha_paper, beta_link, beta_host, args.link_gbit)


if __name__ == "__main__":
    main()
