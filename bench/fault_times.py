"""Fault-tolerance times (issue 17): from a death to the error on every survivor, and shrink.

Starts ``n`` ranks on this host for each ``--ranks`` value (tcp; ``--path sockets`` or
``shm``), lets a middle rank exit (``os._exit``) while the others wait in a barrier,
and measures, on the wall clock every process of one host shares:

- detection: from the victim's last instant to the error on the *last* survivor;
- shrink: from the moment the last survivor entered ``shrink()`` to the moment the
  last one left it (the part that no survivor can shorten by arriving early).

Run from the repository root (not a test: figures go in docs/fault-tolerance.md)::

    .venv/bin/python bench/fault_times.py --ranks 2 4 8 16 --repeat 5

Prints one line per size: medians over ``--repeat`` jobs, in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def rank_main(rank: int, size: int, stamp_dir: str) -> dict[str, float] | None:
    import numpy as np
    import procgroup as pg

    victim = size // 2
    x = np.ones(8)
    pg.all_reduce(x)
    pg.barrier()
    if rank == victim:
        time.sleep(0.2)  # the others are in the barrier by now
        with open(os.path.join(stamp_dir, "death"), "w") as f:
            f.write(repr(time.time()))
        os._exit(3)
    try:
        pg.barrier()
    except (pg.PeerError, pg.GroupRevokedError):
        pass
    seen = time.time()
    enter = time.time()
    pg.shrink(timeout=120)
    left = time.time()
    pg.all_reduce(x)  # the new world works
    return {"seen": seen, "enter": enter, "left": left}


def one_job(size: int, path: str) -> tuple[float, float]:
    from procgroup.testing import spawn

    env = {"PROCGROUP_TCP_SHM": "1" if path == "shm" else "0"}
    with tempfile.TemporaryDirectory(prefix="procgroup-fault-") as stamps:
        results: list[Any] = spawn(rank_main, size, "tcp", args=(stamps,), env=env, expect_dead=[size // 2],
                                   timeout=120, job_timeout=600)
        with open(os.path.join(stamps, "death")) as f:
            death = float(f.read())
    alive = [r for r in results if r is not None]
    detection = max(r["seen"] for r in alive) - death
    shrink = max(r["left"] for r in alive) - max(r["enter"] for r in alive)
    return detection * 1e3, shrink * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--path", choices=("sockets", "shm"), default="shm")
    args = parser.parse_args()
    print(f"# tcp ({args.path}), one host, {os.cpu_count()} cores; medians of {args.repeat} jobs, ms")
    print(f"{'ranks':>5} {'detection':>10} {'shrink':>8}")
    for size in args.ranks:
        runs = [one_job(size, args.path) for _ in range(args.repeat)]
        det = statistics.median(r[0] for r in runs)
        shr = statistics.median(r[1] for r in runs)
        print(f"{size:>5} {det:>10.1f} {shr:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
