"""Chaos: seeded random failures under mixed work; detection and recovery times.

One job (``chaos_job``) is a run of ``--ranks`` tcp ranks on one host. A seed fixes
everything every rank needs to know alike: the work of each step (an all_reduce on the
world, one on a sub-group, or a send/recv between a random pair of live ranks), one or
two victims (rank 0 among the candidates) and when each dies: before its step's op, or
during a large all_reduce of the world (a timer ends the process mid-collective). The
survivors follow docs/fault-tolerance.md's recipe at every step: run the op, and on a
PeerError or GroupRevokedError revoke the world; then ``agree`` whether everyone's op
succeeded; if not, ``shrink`` and redo the step in the new numbering. Every result is
checked against the value it must have, computed from the live ranks' original numbers.

Times (wall clock: the ranks share one host's clock): *detection*, from the victim's
last instant (it writes the time just before it exits) to the first error on each
survivor that saw one; *recovery*, from that error to the end of the shrink.

    python bench/chaos.py --seeds 50 --ranks 8          # p50/p99 over 50 jobs
    python bench/chaos.py --cutlink --repeat 5 --hosts 4 # cut links on the simulated cluster (root)

tests/test_chaos.py runs a few seeds of the same job (no times asserted).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

STEPS = 24
BIG = 1 << 18  # floats in the all_reduce a victim dies in (2 MiB): long enough to die within


@dataclass(frozen=True)
class Death:
    rank: int  # original rank
    step: int
    mid: bool  # during the step's large world all_reduce, else before its op
    delay: float  # seconds into the all_reduce (mid only)


def plan(seed: int, size: int) -> list[Death]:
    """The victims of ``seed``: one or two, any rank (rank 0 included), at random steps."""
    rng = random.Random(seed)
    count = 1 if size < 4 else rng.choice((1, 2))
    victims = rng.sample(range(size), count)
    return [Death(v, rng.randrange(2, STEPS - 4), rng.random() < 0.5, rng.uniform(0.0, 0.004)) for v in victims]


def _step_op(seed: int, step: int, size: int) -> tuple[str, tuple[int, int]]:
    """The step's op, the same on every rank: the world, a sub-group (half), or a pair."""
    rng = random.Random(seed * 7919 + step * 104729 + size)
    kind = rng.choice(("world", "group", "p2p"))
    a, b = rng.sample(range(size), 2) if size >= 2 else (0, 0)
    return kind, (a, b)


class Chaos:
    """One rank's run of the seed's steps, with the recipe around each."""

    def __init__(self, rank: int, size: int, seed: int, outdir: str) -> None:
        import procgroup as pg

        self.pg = pg
        self.orig = rank
        self.seed = seed
        self.outdir = outdir
        self.deaths = {d.step: d for d in plan(seed, size) if d.rank == rank}
        self.dying = {d.step for d in plan(seed, size)}
        self.live = list(range(size))  # original rank of each current rank
        self.groups: tuple[Any, Any] = (None, None)
        self.checks = 0
        self.errors: list[float] = []
        self.recoveries: list[float] = []
        self._make_groups()

    def _make_groups(self) -> None:
        n = len(self.live)
        half = max(1, n // 2)
        self.groups = (self.pg.new_group(list(range(half))), self.pg.new_group(list(range(half, n))) if n > half else None)

    def _die(self, death: Death) -> None:
        def end() -> None:
            Path(self.outdir, f"died-{self.orig}").write_text(repr(time.time()))
            os._exit(3)

        if death.mid:
            threading.Timer(death.delay, end).start()
        else:
            end()

    def run(self) -> dict[str, Any]:
        step = 0
        while step < STEPS:
            pg = self.pg
            death = self.deaths.get(step)
            ok = True
            try:
                if death is not None:
                    self._die(death)
                self._op(step)
            except (pg.PeerError, pg.GroupRevokedError):
                ok = False
                self.errors.append(time.time())
                pg.revoke()
            if self._agree(ok):
                step += 1
                continue
            self._recover()
        return {"orig": self.orig, "size": len(self.live), "live": self.live, "checks": self.checks,
                "errors": self.errors, "recoveries": self.recoveries}

    def _agree(self, ok: bool) -> bool:
        pg = self.pg
        try:
            return pg.agree(ok, timeout=60)
        except pg.GroupRevokedError:
            return False

    def _recover(self) -> None:
        """revoke -> shrink -> who is left -> new sub-groups; again if another death
        interrupts it."""
        pg = self.pg
        started = time.time()
        while True:
            try:
                pg.revoke()
                pg.shrink(timeout=60)
                self.recoveries.append(time.time() - started)
                live: list[Any] = [None] * pg.get_world_size()
                pg.all_gather_object(live, self.orig)
                self.live = [int(x) for x in live]
                self._make_groups()
                return
            except (pg.PeerError, pg.GroupRevokedError):
                self.errors.append(time.time())
                continue

    def _op(self, step: int) -> None:
        pg = self.pg
        n, me = len(self.live), pg.get_rank()
        if step in self.dying:  # a victim's step: everyone runs the large all_reduce
            x = np.full(BIG, float(step + self.orig + 1))
            pg.all_reduce(x)
            self._expect(x, float(sum(step + o + 1 for o in self.live)))
            return
        kind, (a, b) = _step_op(self.seed, step, n)
        if kind == "world":
            x = np.full(64, float(step * 100 + self.orig + 1))
            pg.all_reduce(x)
            self._expect(x, float(sum(step * 100 + o + 1 for o in self.live)))
        elif kind == "group":
            g = self.groups[step % 2] or self.groups[0]
            if me not in g.ranks:
                return
            x = np.full(64, float(step * 100 + self.orig + 1))
            pg.all_reduce(x, group=g)
            self._expect(x, float(sum(step * 100 + self.live[r] + 1 for r in g.ranks)))
        elif me == a and a != b:
            pg.send(np.full(32, float(step * 7 + self.orig)), dst=b)
        elif me == b and a != b:
            got = np.empty(32)
            pg.recv(got, src=a)
            self._expect(got, float(step * 7 + self.live[a]))

    def _expect(self, x: np.ndarray, value: float) -> None:
        if not np.all(x == value):
            raise AssertionError(f"wrong result: {x[:3]} != {value} (live {self.live})")
        self.checks += 1


def chaos_job(rank: int, size: int, seed: int, outdir: str) -> dict[str, Any]:
    """One rank of a chaos job (procgroup.testing.spawn's function)."""
    return Chaos(rank, size, seed, outdir).run()


def run_seed(seed: int, ranks: int, job_timeout: float = 240.0) -> dict[str, Any]:
    """Run one seed's job; check that the survivors agree; return its times."""
    from procgroup.testing import spawn

    deaths = plan(seed, ranks)
    victims = sorted(d.rank for d in deaths)
    with tempfile.TemporaryDirectory(prefix="procgroup-chaos-") as tmp:
        results = spawn(chaos_job, ranks, "tcp", args=(seed, tmp), expect_dead=victims, timeout=120,
                        job_timeout=job_timeout)
        died = {v: float(Path(tmp, f"died-{v}").read_text()) for v in victims if Path(tmp, f"died-{v}").exists()}
    alive = [r for r in results if r is not None]
    survivors = sorted(r["orig"] for r in alive)
    for r in alive:
        assert r["live"] == survivors, (r["live"], survivors, seed)
        assert r["size"] == len(survivors)
    first_death = min(died.values()) if died else None
    detection = [r["errors"][0] - first_death for r in alive if r["errors"] and first_death is not None]
    recovery = [x for r in alive for x in r["recoveries"][:1]]
    return {"seed": seed, "victims": victims, "plan": [d.__dict__ for d in deaths], "survivors": survivors,
            "checks": sum(r["checks"] for r in alive), "detection_s": detection, "recovery_s": recovery}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _cutlink(hosts: int, repeat: int, heartbeat: float) -> dict[str, Any]:
    """Cut one host's link on the simulated cluster, ``repeat`` times (needs root)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import test_survive_cutlink as cut  # the test's runner, one cut per job

    cut.HEARTBEAT_S = heartbeat
    detect: list[float] = []
    shrink: list[float] = []
    for i in range(repeat):
        victim = (i + 1) % hosts
        with tempfile.TemporaryDirectory(prefix="procgroup-cut-") as tmp:
            cut_at, results = cut.run_cut(hosts, victim, Path(tmp))
        out = cut._results(results)
        detect += [out[r]["detected_at"] - cut_at for r in out if r != victim]
        shrink.append(max(out[r]["shrink_s"] for r in out if r != victim))
    return {"detection_s": detect, "shrink_s": shrink}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="jobs to run (seeds 1..N)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--json", help="write every job's record here")
    ap.add_argument("--cutlink", action="store_true", help="cut links on the simulated cluster instead")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--heartbeat", type=float, default=3.0, help="PROCGROUP_HEARTBEAT_TIMEOUT for --cutlink")
    args = ap.parse_args(argv)
    if args.cutlink:
        got = _cutlink(args.hosts, args.repeat, args.heartbeat)
        print(f"cut link, {args.hosts} hosts, heartbeat {args.heartbeat:g} s, {args.repeat} jobs: detection "
              f"p50 {_pct(got['detection_s'], 50):.3f} s p99 {_pct(got['detection_s'], 99):.3f} s; shrink "
              f"p50 {_pct(got['shrink_s'], 50) * 1e3:.1f} ms p99 {_pct(got['shrink_s'], 99) * 1e3:.1f} ms")
        return
    records = []
    hangs = wrong = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        try:
            records.append(run_seed(seed, args.ranks))
        except AssertionError as exc:  # a wrong result, a disagreement or a hang (job timeout)
            text = str(exc)
            hangs += "timed out" in text or "never reported" in text
            wrong += "timed out" not in text and "never reported" not in text
            print(f"seed {seed}: FAILED: {text[:2000]}", file=sys.stderr)
    detect = [x for r in records for x in r["detection_s"]]
    recover = [x for r in records for x in r["recovery_s"]]
    print(f"{args.ranks} ranks, {len(records)} of {args.seeds} jobs passed ({hangs} hangs, {wrong} other failures), "
          f"{sum(r['checks'] for r in records)} results checked")
    print(f"detection: p50 {_pct(detect, 50) * 1e3:.1f} ms, p99 {_pct(detect, 99) * 1e3:.1f} ms (n={len(detect)})")
    print(f"recovery (revoke+shrink): p50 {_pct(recover, 50) * 1e3:.1f} ms, p99 {_pct(recover, 99) * 1e3:.1f} ms "
          f"(n={len(recover)})")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
