"""``python -m procgroup.testing.simcluster --hosts 4 --rate 1gbit --delay 0.1ms -- CMD ...``

Runs CMD once on every simulated host (rank = host index, env:// variables set, MASTER_ADDR
the first host), prints each host's output prefixed ``[h<i>]`` as it comes, and exits with
the first failing host's status (0 when all succeed). ``--check`` measures the links
instead (raw TCP streams and round trips); ``--cleanup`` removes what killed runs left.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from ._cluster import DEFAULT_QUEUE_BYTES, SimCluster, parse_delay, parse_rate
from ._netns import SetupError, remove_cluster, stale_clusters


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m procgroup.testing.simcluster",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument(
        "--hosts", "-H", type=int, default=4, help="simulated hosts, one rank each (4)"
    )
    p.add_argument(
        "--rate",
        default="1gbit",
        help="each link's rate, e.g. 1gbit, 100mbit; 'none': unlimited (1gbit)",
    )
    p.add_argument(
        "--delay",
        default="0.1ms",
        help="one-way delay host to host, e.g. 0.1ms, 50us (0.1ms)",
    )
    p.add_argument(
        "--queue",
        default=str(DEFAULT_QUEUE_BYTES),
        help="bytes a switch port may queue (2M)",
    )
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds the whole command may take (3600)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds the others get once a host fails (30)",
    )
    p.add_argument(
        "--python", default=sys.executable, help="interpreter of the switch (this one)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="measure raw TCP throughput and round-trip time",
    )
    p.add_argument(
        "--check-bytes", default="256M", help="bytes per stream of --check (256M)"
    )
    p.add_argument(
        "--cleanup",
        action="store_true",
        help="remove clusters whose creator is gone, then exit",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- CMD ARGS... run on every host"
    )
    return p


def _check(cluster: SimCluster, nbytes: int) -> None:
    n = len(cluster.hosts)
    limit = (
        "unlimited"
        if cluster.rate_bps is None
        else f"{cluster.rate_bps / 8e6:.1f} MB/s"
    )
    print(
        f"# {n} hosts, rate {limit} per link (TCP goodput at most 95.6 % of it), delay {cluster.delay_s * 1e6:.0f} us"
    )
    if n >= 2:
        rtt = cluster.rtt(0, 1)
        print(
            f"round trip h0-h1, 8 B over TCP: median {rtt * 1e6:.1f} us (2 x delay = {2e6 * cluster.delay_s:.0f} us)"
        )
        one = cluster.streams([(0, 1)], nbytes)[0]
        print(f"one stream h0 -> h1: {one / 1e6:.1f} MB/s")
        ring = cluster.streams([(i, (i + 1) % n) for i in range(n)], nbytes)
        ring_text = " ".join(f"{r / 1e6:.1f}" for r in ring)
        print(
            f"ring, {n} streams at once: {ring_text} MB/s (median {sorted(ring)[n // 2] / 1e6:.1f})"
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    if args.cleanup:
        for tag in stale_clusters():
            print(f"removing {tag}")
            remove_cluster(tag)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command and not args.check:
        _parser().error("give a command after --, or --check")

    def stop(signum: int, _frame: Any) -> None:
        # once: a second Ctrl-C must not cut the teardown short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    rate = None if args.rate.lower() == "none" else parse_rate(args.rate)
    try:
        with SimCluster(
            args.hosts,
            rate=rate,
            delay=parse_delay(args.delay),
            queue_bytes=_size(args.queue),
            python=args.python,
        ) as cluster:
            if args.check:
                _check(cluster, _size(args.check_bytes))
                status = 0
            else:
                results = cluster.run(
                    command,
                    master_port=args.master_port,
                    timeout=args.timeout,
                    grace=args.grace,
                    echo=sys.stdout,
                )
                status = 0
                for r in results:
                    state = "timed out" if r.timed_out else f"exit {r.returncode}"
                    print(
                        f"# {r.host.hostname} ({r.host.address}): {state}",
                        file=sys.stderr,
                    )
                    if r.returncode and not status:
                        status = (
                            r.returncode if r.returncode > 0 else 128 - r.returncode
                        )
        if args.verbose:
            print(cluster.forwarder_log, end="", file=sys.stderr)
        return status
    except SetupError as exc:
        print(f"simcluster: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simcluster: interrupted; everything was torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
