"""What the flight recorder costs per op (docs/debugging.md, "What it costs").

Two measurements:

``instr``: instructions per op, counted by callgrind (the same under any load). In one
process, a one-rank tcp world (file:// rendezvous) calls ``dist.all_reduce`` on an 8 B
float32 array; the world's fast-path callable is swapped between a no-op and the no-op
recorded, and between the channel's own all_reduce unrecorded and recorded. Then two more
processes call the world's fast path as it is, one with ``PROCGROUP_FLIGHT_RECORDER=0``,
one with the recorder on. Each variant's loop runs inside ``exec()``, the only place
callgrind collects, one dump each. Needs valgrind.

``ab``: ``procgroup-bench -np N --sizes 8`` with the recorder off
(``PROCGROUP_FLIGHT_RECORDER=0``) and on, alternated, the order swapped every pair; prints
each pair's medians and the median of the ratios on/off.

    python bench/flight_recorder_cost.py instr [--calls 2000]
    python bench/flight_recorder_cost.py ab [--pairs 10] [--ranks 2,4] [--iters 20000]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from typing import Any

ENV_RING = "PROCGROUP_FLIGHT_RECORDER"


def _variants() -> list[tuple[str, Any]]:
    """(name, fast-path callable) pairs on an initialised one-rank world."""
    from procgroup import _state
    from procgroup.backend import _recorder

    group = _state.resolve(None)
    channel = group.channel

    def noop(array: Any, op: Any) -> None:
        return None

    real = channel._blocking("all_reduce", False)
    return [
        ("no-op", noop),
        ("no-op, recorded", _recorder.wrap(channel, "all_reduce", noop)),
        ("all_reduce", real),
        ("all_reduce, recorded", _recorder.wrap(channel, "all_reduce", real)),
    ]


def _inner(calls: int, as_is: bool = False) -> None:
    """Runs under callgrind: one exec() per variant (``as_is``: the world's own fast path
    only, recorded or not as $PROCGROUP_FLIGHT_RECORDER says)."""
    import numpy as np

    import procgroup as dist
    from procgroup import _ops, _state

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("tcp", init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
        group = _state.resolve(None)
        fast = group.fast
        x = np.ones(2, dtype=np.float32)
        all_reduce = dist.all_reduce

        def loop(n: int) -> None:
            for _ in range(n):
                all_reduce(x)

        names = []
        variants = [("as is", fast.all_reduce)] if as_is else _variants()
        for name, fn in variants:
            group.fast = _ops._world_fast = fast._replace(all_reduce=fn)
            loop(200)  # warm: caches, specialised bytecode
            exec("loop(calls)", {"loop": loop, "calls": calls})
            names.append(name)
        group.fast = _ops._world_fast = fast
        print("VARIANTS " + json.dumps(names), flush=True)
        dist.destroy_process_group()


def _count(calls: int, as_is: bool, env: dict[str, str]) -> dict[str, float]:
    """Instructions per call of each variant of one ``_inner`` run under callgrind."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=builtin_exec",
               "--dump-after=builtin_exec", f"--callgrind-out-file={out}/cg.out",
               sys.executable, __file__, "_inner", "--calls", str(calls)] + (["--as-is"] if as_is else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600, env=env)
        names = json.loads(done.stdout.split("VARIANTS ", 1)[1].splitlines()[0])
        dumps = sorted(glob.glob(f"{out}/cg.out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        totals = []
        for path in dumps:
            with open(path, encoding="utf-8") as f:
                found = re.search(r"^totals: (\d+)", f.read(), re.M)
            totals.append(int(found.group(1)) if found else 0)
        # the imports' exec() calls dump too: the variants' are the last ones
        return dict(zip(names, (t / calls for t in totals[-len(names):])))


def instr(calls: int) -> None:
    env = dict(os.environ)
    env.pop(ENV_RING, None)
    per_op = _count(calls, False, env)
    for name, n in per_op.items():
        print(f"{name:42s} {n:9,.0f} instructions/op")
    print(f"recorder on a no-op: +{per_op['no-op, recorded'] - per_op['no-op']:,.0f}; "
          f"on the real all_reduce: +{per_op['all_reduce, recorded'] - per_op['all_reduce']:,.0f}")
    on = _count(calls, True, env)["as is"]
    off = _count(calls, True, dict(env, **{ENV_RING: "0"}))["as is"]
    print(f"dist.all_reduce as is: recorder off {off:,.0f}, on {on:,.0f} instructions/op (+{on - off:,.0f})")


def _bench(ranks: int, on: bool, iters: int) -> tuple[float, float]:
    env = dict(os.environ)
    env.pop(ENV_RING, None)
    if not on:
        env[ENV_RING] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "procgroup-bench"), "-np", str(ranks),
                        "--sizes", "8", "-n", str(iters), "-q", "--json", path],
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=1200)
        with open(path, encoding="utf-8") as f:
            row = json.load(f)["results"][0]
    return float(row["time_us"]), float(row["min_us"])


def ab(pairs: int, ranks: list[int], iters: int) -> None:
    for n in ranks:
        ratios = []
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {on: _bench(n, on, iters) for on in order}
            ratios.append(got[True][0] / got[False][0])
            print(f"{n} ranks, pair {i}: off {got[False][0]:.2f} us (min {got[False][1]:.2f}), "
                  f"on {got[True][0]:.2f} us (min {got[True][1]:.2f}), ratio {ratios[-1]:.3f}", flush=True)
        print(f"{n} ranks: median of {pairs} ratios on/off {statistics.median(ratios):.3f} "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["instr", "ab", "_inner"])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--as-is", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mode == "_inner":
        _inner(a.calls, a.as_is)
    elif a.mode == "instr":
        instr(a.calls)
    else:
        ab(a.pairs, [int(r) for r in a.ranks.split(",")], a.iters)


if __name__ == "__main__":
    main()
