"""Fault-tolerance times (issue 17): from a death to the error on every survivor, and shrink.

Starts ``n`` ranks on this host for each ``--ranks`` value (tcp; ``--path sockets`` or
``shm``), lets a middle rank exit (``os._exit``) while the others wait in a barrier,
and measures, on the wall clock every process of one host shares:

- detection: from the victim's last instant to the error on the *last* survivor;
- shrink: from the moment the last survivor entered ``shrink()`` to the moment the
  last one left it (the part that no survivor can shorten by arriving early).

Run from the repository root (not a test: figures go in docs/fault-tolerance.md)::

    .venv/bin/python bench/fault_times.py --ranks 2 4 8 16 --repeat 5

``--simcluster`` runs each job on the simulated cluster instead (one rank per host,
``--rate`` and ``--delay`` per link; root, as procgroup.testing.simcluster needs): the
socket path between hosts, as on a real cluster::

    sudo .venv/bin/python bench/fault_times.py --simcluster --ranks 4 8 --repeat 5

``--backend mpi`` measures what a death does to an mpi job instead: the mpi backend
cannot shrink (MPI's ULFM is not usable, docs/fault-tolerance.md), and mpiexec ends
the whole job. It starts ``mpiexec -n N`` (the one next to this Python), a middle rank
exits while the others wait in a barrier, and it reports the time from the victim's
last instant until mpiexec has returned, i.e. every rank has ended::

    .venv313/bin/python bench/fault_times.py --backend mpi --ranks 4 8 --repeat 5

Prints one line per size: medians over ``--repeat`` jobs, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
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


def _times(death: float, alive: list[dict[str, float]]) -> tuple[float, float]:
    """(detection, shrink) in ms from the death stamp and the survivors' stamps."""
    detection = max(r["seen"] for r in alive) - death
    shrink = max(r["left"] for r in alive) - max(r["enter"] for r in alive)
    return detection * 1e3, shrink * 1e3


def cluster_rank(stamp_dir: str) -> None:
    """One simulated host's rank (env:// from simcluster): its stamps go to ``stamp_dir``."""
    import procgroup as pg

    pg.init_process_group("tcp", timeout=120)
    out = rank_main(pg.get_rank(), pg.get_world_size(), stamp_dir)
    old_rank = int(os.environ["RANK"])
    with open(os.path.join(stamp_dir, f"rank{old_rank}.json"), "w") as f:
        json.dump(out, f)
    pg.destroy_process_group()


def cluster_job(size: int, rate: str, delay: str) -> tuple[float, float]:
    """One job on a simulated cluster of ``size`` hosts (needs root)."""
    with tempfile.TemporaryDirectory(prefix="procgroup-fault-") as stamps:
        env = {**os.environ, "PROCGROUP_JOB_TOKEN": secrets.token_hex(16)}
        cmd = [sys.executable, "-m", "procgroup.testing.simcluster", "--hosts", str(size), "--rate", rate,
               "--delay", delay, "--grace", "120", "--timeout", "600", "--",
               sys.executable, os.path.abspath(__file__), "--cluster-rank", stamps]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode not in (0, 3):  # 3: the victim's own exit status
            raise RuntimeError(f"simcluster job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        with open(os.path.join(stamps, "death")) as f:
            death = float(f.read())
        alive = []
        for r in range(size):
            if r != size // 2:
                with open(os.path.join(stamps, f"rank{r}.json")) as f:
                    alive.append(json.load(f))
    return _times(death, alive)


def one_job(size: int, path: str) -> tuple[float, float]:
    from procgroup.testing import spawn

    env = {"PROCGROUP_TCP_SHM": "1" if path == "shm" else "0"}
    with tempfile.TemporaryDirectory(prefix="procgroup-fault-") as stamps:
        results: list[Any] = spawn(rank_main, size, "tcp", args=(stamps,), env=env, expect_dead=[size // 2],
                                   timeout=120, job_timeout=600)
        with open(os.path.join(stamps, "death")) as f:
            death = float(f.read())
    return _times(death, [r for r in results if r is not None])


def mpi_rank(stamp_dir: str) -> None:
    """One rank of an mpi job (``--mpi-rank``): a middle rank exits during a barrier."""
    import numpy as np
    import procgroup as pg

    pg.init_process_group("mpi", timeout=600)
    rank, size = pg.get_rank(), pg.get_world_size()
    x = np.ones(8)
    pg.all_reduce(x)
    pg.barrier()
    if rank == size // 2:
        time.sleep(0.2)  # the others are in the barrier by now
        with open(os.path.join(stamp_dir, "death"), "w") as f:
            f.write(repr(time.time()))
        os._exit(3)
    pg.barrier()  # never returns: mpiexec ends the job (the op timeout is 600 s)


def mpi_job(size: int) -> float:
    """ms from the death of a middle rank until mpiexec returned (every rank ended)."""
    from procgroup.testing import mpiexec_command

    with tempfile.TemporaryDirectory(prefix="procgroup-fault-") as stamps:
        env = {**os.environ, "PROCGROUP_MPI_ABORT_ON_EXCEPTION": "0"}  # only the death ends the job
        cmd = mpiexec_command() + ["-n", str(size), sys.executable, os.path.abspath(__file__), "--mpi-rank", stamps]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        ended = time.time()
        if not os.path.exists(os.path.join(stamps, "death")):
            raise RuntimeError(f"mpi job failed before the death ({proc.returncode}):\n{proc.stderr[-3000:]}")
        with open(os.path.join(stamps, "death")) as f:
            death = float(f.read())
    return (ended - death) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--path", choices=("sockets", "shm"), default="shm")
    parser.add_argument("--simcluster", action="store_true", help="one rank per simulated host (root)")
    parser.add_argument("--rate", default="1gbit", help="with --simcluster: each link's rate (1gbit)")
    parser.add_argument("--delay", default="0.1ms", help="with --simcluster: one-way delay (0.1ms)")
    parser.add_argument("--backend", choices=("tcp", "mpi"), default="tcp",
                        help="mpi: time from a death to the end of the whole job (mpi cannot shrink)")
    parser.add_argument("--cluster-rank", metavar="STAMP_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--mpi-rank", metavar="STAMP_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cluster_rank:
        cluster_rank(args.cluster_rank)
        return
    if args.mpi_rank:
        mpi_rank(args.mpi_rank)
        return
    if args.backend == "mpi":
        print(f"# mpi under mpiexec, one host, {os.cpu_count()} cores; medians of {args.repeat} jobs, ms")
        print(f"{'ranks':>5} {'job ended':>10}")
        for size in args.ranks:
            ended = statistics.median(mpi_job(size) for _ in range(args.repeat))
            print(f"{size:>5} {ended:>10.1f}", flush=True)
        return
    if args.simcluster:
        print(f"# tcp (sockets), simulated cluster: one rank per host, {args.rate} links, {args.delay} "
              f"one-way delay, {os.cpu_count()} cores; medians of {args.repeat} jobs, ms")
    else:
        print(f"# tcp ({args.path}), one host, {os.cpu_count()} cores; medians of {args.repeat} jobs, ms")
    print(f"{'ranks':>5} {'detection':>10} {'shrink':>8}")
    for size in args.ranks:
        if args.simcluster:
            runs = [cluster_job(size, args.rate, args.delay) for _ in range(args.repeat)]
        else:
            runs = [one_job(size, args.path) for _ in range(args.repeat)]
        det = statistics.median(r[0] for r in runs)
        shr = statistics.median(r[1] for r in runs)
        print(f"{size:>5} {det:>10.1f} {shr:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
