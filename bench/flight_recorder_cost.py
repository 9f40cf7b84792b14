"""What the flight recorder costs per op (docs/debugging.md, "What it costs").

Two measurements:

``instr``: instructions per op, counted by callgrind (the same under any load). In one
process, a one-rank tcp world (file:// rendezvous) calls ``dist.all_reduce`` and
``dist.send``/``dist.recv`` (to itself is refused, so the channel's send and recv are
swapped for no-ops) on an 8 B float32 array: the world's fast path with the recorder
(the op function writes the entry) and without it (the fast path's ``*_spec`` set to
None: what ``PROCGROUP_FLIGHT_RECORDER=0`` gives), for the channel's own all_reduce and a
no-op in its place. Then two more processes call ``dist.all_reduce`` on the world's fast
path as it is, one with ``PROCGROUP_FLIGHT_RECORDER=0``, one with the recorder on. Each
variant's loop runs inside ``exec()``, the only place callgrind collects, one dump each.
Needs valgrind.

``cachesim``: ``dist.all_reduce`` as it is (the two ``instr`` processes, recorder off
and on) under callgrind's cache and branch simulation: what the entry adds besides its
instructions (instruction and data cache misses, mispredicted branches), against the rate
of the op's own code. Needs valgrind.

``ab``: ``procgroup-bench -np N --sizes 8`` with the recorder off
(``PROCGROUP_FLIGHT_RECORDER=0``) and on, alternated, the order swapped every pair; prints
each pair's medians and the median of the ratios on/off.

``bisect``: one job of ``--ranks`` ranks (procgroup-run) times loops of ``dist.all_reduce``
(8 B) with the recorder's entry off, on, and on with one of its parts left out (the
clock, the size, the op number, the append), the variants interleaved round by round so
that load hits them alike; rank 0 prints each variant's median time per op and its ratio
to "off". The recorder stays configured in every variant (its thread, the slow-wait
lookup): only the entry differs, so what ``ab`` measures beyond this is the rest.
"on, twice" writes the entry two times per call (a cost made of the entry's own work
doubles). With tcp's shared-memory arena (every rank on one host) two more variants wrap
the arena's wait: "off, waits wrapped" only passes each wait on, "on, after the counter"
writes the entry in the wait that follows this rank's own counter store, where a rank
waits for its peers: compared with the first, it shows whether the entry costs less off
the path that comes before a rank's data goes out.

    python bench/flight_recorder_cost.py instr [--calls 2000]
    python bench/flight_recorder_cost.py cachesim [--calls 2000]
    python bench/flight_recorder_cost.py ab [--pairs 10] [--ranks 2,4] [--iters 20000]
    python bench/flight_recorder_cost.py bisect [--ranks 2] [--iters 2000] [--rounds 41]
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ENV_RING = "PROCGROUP_FLIGHT_RECORDER"


def _variants(fast: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, op, FastPath fields to set) on an initialised one-rank world."""

    def noop(array: Any, *args: Any) -> int:
        return 0

    real = fast.all_reduce
    unrecorded = {"all_reduce_spec": None, "send_spec": None, "recv_spec": None}
    return [
        ("all_reduce: a no-op, unrecorded", "all_reduce", dict(unrecorded, all_reduce=noop)),
        ("all_reduce: a no-op, recorded", "all_reduce", {"all_reduce": noop}),
        ("all_reduce: the channel's, unrecorded", "all_reduce", dict(unrecorded, all_reduce=real)),
        ("all_reduce: the channel's, recorded", "all_reduce", {"all_reduce": real}),
        ("send: a no-op, unrecorded", "send", dict(unrecorded, send=noop)),
        ("send: a no-op, recorded", "send", {"send": noop}),
        ("recv: a no-op, unrecorded", "recv", dict(unrecorded, recv=noop)),
        ("recv: a no-op, recorded", "recv", {"recv": noop}),
    ]


def _inner(calls: int, as_is: bool = False) -> None:
    """Runs under callgrind: one exec() per variant (``as_is``: the world's own all_reduce
    fast path only, recorded or not as $PROCGROUP_FLIGHT_RECORDER says)."""
    import numpy as np

    import procgroup as dist
    from procgroup import _state

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("tcp", init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
        group = _state.resolve(None)
        fast = group.fast
        x = np.ones(2, dtype=np.float32)
        dist.all_reduce(x)  # the checked path lets (SUM, float32) through to the fast path
        all_reduce, send, recv = dist.all_reduce, dist.send, dist.recv

        def all_reduce_loop(n: int) -> None:
            for _ in range(n):
                all_reduce(x)

        # the world's fast path sends to rank 1 of a one-rank world: its rank index is
        # widened for these variants (the channel's send and recv are no-ops then)
        def send_loop(n: int) -> None:
            for _ in range(n):
                send(x, 1)

        def recv_loop(n: int) -> None:
            for _ in range(n):
                recv(x, 1)

        loops = {"all_reduce": all_reduce_loop, "send": send_loop, "recv": recv_loop}
        names = []
        variants = [("as is", "all_reduce", {})] if as_is else _variants(fast)
        # "peers" (world rank -> group rank of the other members; "index" in older trees)
        peers = "peers" if hasattr(fast, "peers") else "index"
        saved = {k: getattr(fast, k) for k in ("all_reduce", "send", "recv", "all_reduce_spec", "send_spec",
                                               "recv_spec", peers, "ranks")}
        if not as_is:
            from procgroup import _ops

            _ops._p2p_dtypes.add(x.dtype)  # as the checked path would after a first call
        for name, op, fields in variants:
            for k, v in saved.items():
                setattr(fast, k, v)
            if not as_is:
                setattr(fast, peers, {1: 1} if peers == "peers" else {0: 0, 1: 1})
                fast.ranks = (0, 1)
            for k, v in fields.items():
                setattr(fast, k, v)
            loop = loops[op]
            loop(200)  # warm: caches, specialised bytecode
            exec("loop(calls)", {"loop": loop, "calls": calls})
            names.append(name)
        for k, v in saved.items():
            setattr(fast, k, v)
        print("VARIANTS " + json.dumps(names), flush=True)
        dist.destroy_process_group()


def _count(calls: int, as_is: bool, env: dict[str, str], sim: bool = False) -> dict[str, Any]:
    """Instructions per call of each variant of one ``_inner`` run under callgrind (``sim``:
    each variant's events per call instead, with callgrind's cache and branch simulation:
    a dict of Ir, I1mr, D1mr, Bcm, Bim ...)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--toggle-collect=builtin_exec",
               "--dump-after=builtin_exec", f"--callgrind-out-file={out}/cg.out"]
        cmd += ["--cache-sim=yes", "--branch-sim=yes"] if sim else []
        cmd += [sys.executable, __file__, "_inner", "--calls", str(calls)] + (["--as-is"] if as_is else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=3600, env=env)
        names = json.loads(done.stdout.split("VARIANTS ", 1)[1].splitlines()[0])
        dumps = sorted(glob.glob(f"{out}/cg.out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        totals: list[dict[str, float]] = []
        for path in dumps:
            with open(path, encoding="utf-8") as f:
                text = f.read()
            events = re.search(r"^events: (.*)$", text, re.M)
            found = re.search(r"^totals: (.*)$", text, re.M)
            keys = events.group(1).split() if events else ["Ir"]
            values = [int(v) for v in found.group(1).split()] if found else [0]
            totals.append({k: v / calls for k, v in zip(keys, values)})
        # the imports' exec() calls dump too: the variants' are the last ones
        per_op = dict(zip(names, totals[-len(names):]))
        return per_op if sim else {name: got["Ir"] for name, got in per_op.items()}


def cache_sim(calls: int) -> None:
    """``dist.all_reduce`` as it is, recorder off and on, under callgrind's cache and
    branch simulation (its model: 32 KB L1 caches): what the entry adds besides its
    instructions (misses of the instruction and data caches, mispredicted branches)."""
    env = dict(os.environ)
    env.pop(ENV_RING, None)
    on = _count(calls, True, env, sim=True)["as is"]
    off = _count(calls, True, dict(env, **{ENV_RING: "0"}), sim=True)["as is"]
    names = {"Ir": "instructions", "I1mr": "L1 instruction misses", "D1mr": "L1 data read misses",
             "D1mw": "L1 data write misses", "Bcm": "mispredicted conditional branches",
             "Bim": "mispredicted indirect branches"}
    print("dist.all_reduce as is, per op: recorder off / on (added, added per 1,000 instructions added; "
          "the op's own per 1,000 instructions)")
    for key, label in names.items():
        a, b = off.get(key, 0.0), on.get(key, 0.0)
        added = b - a
        rate = 1000 * added / max(on["Ir"] - off["Ir"], 1)
        print(f"  {label:36s} {a:9,.0f} / {b:9,.0f} (+{added:,.0f}; {rate:.1f} per 1k added, "
              f"{1000 * a / max(off['Ir'], 1):.1f} per 1k in the op)")


def instr(calls: int) -> None:
    env = dict(os.environ)
    env.pop(ENV_RING, None)
    per_op = _count(calls, False, env)
    for name, n in per_op.items():
        print(f"{name:42s} {n:9,.0f} instructions/op")
    for op, callee in (("all_reduce", "a no-op"), ("all_reduce", "the channel's"), ("send", "a no-op"),
                       ("recv", "a no-op")):
        on, off = per_op[f"{op}: {callee}, recorded"], per_op[f"{op}: {callee}, unrecorded"]
        print(f"the recorder on {op} ({callee}): +{on - off:,.0f}")
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


#: the all_reduce fast path's entry lines, and what each bisect variant puts in their place
_ENTRY = "entry = (spec, next(f.coll), None, tensor.nbytes, dtype, _ns())"
_APPEND = "f.append(entry)"
_BISECT = {
    "off, a copy": (_ENTRY, _ENTRY),  # run with the entry off: what exec's copy itself costs
    "on": (_ENTRY, _ENTRY),
    "no clock": (_ENTRY, _ENTRY.replace("_ns()", "0")),
    "no size": (_ENTRY, _ENTRY.replace("tensor.nbytes", "8")),
    "no op number": (_ENTRY, _ENTRY.replace("next(f.coll)", "0")),
    "no append": (_APPEND, "pass"),
    "ring of 16": (_APPEND, "_ring16(entry)"),  # the same work on a ring that stays in cache
    # the entry written twice: if the cost is the entry's instructions, this costs twice "on"
    "on, twice": (_APPEND, f"{_APPEND}\n{' ' * 12}{_ENTRY}\n{' ' * 12}{_APPEND}"),
}
#: the variants that need the shared-memory arena (every rank on one host): the fast path's
#: entry off, the channel's waits wrapped; "after the counter" writes the same entry in the
#: wait that follows this rank's own counter store (where the rank waits for its peers)
_ARENA = ("off, waits wrapped", "on, after the counter")


def _bisect_rank(iters: int, rounds: int) -> None:
    """One rank of ``bisect`` (run under procgroup-run)."""
    import inspect
    import textwrap

    import numpy as np

    import procgroup as dist
    from procgroup import _ops, _state
    from procgroup.backend import _recorder

    dist.init_process_group("tcp")
    fast = _state.resolve(None).fast
    x = np.zeros(2, dtype=np.float32)  # zeros: a sum that never overflows
    dist.all_reduce(x)  # the checked path lets (SUM, float32) through to the fast path
    source = textwrap.dedent(inspect.getsource(_ops.all_reduce))
    for line in (_ENTRY, _APPEND):
        if source.count(line) != 1:
            raise SystemExit(f"bisect: the all_reduce fast path no longer has the line {line!r}")
    spec = fast.all_reduce_spec
    variants: dict[str, Any] = {"off": _ops.all_reduce}
    for name, (line, instead) in _BISECT.items():
        scope = dict(vars(_ops), _ring16=collections.deque(maxlen=16).append)
        exec(source.replace(line, instead), scope)  # the op layer's own source, one line changed
        variants[name] = scope["all_reduce"]
        _recorder.holds_entry(scope["all_reduce"])
    arena = getattr(_state.resolve(None).channel, "_shm", None)
    wrapped = _wrapped_waits(arena, fast, spec, x) if arena is not None else None
    for name in _ARENA if wrapped is not None else ():
        variants[name] = _ops.all_reduce
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fast.all_reduce_spec = None if name.startswith("off") or name in _ARENA else spec
            op = variants[name]
            dist.barrier()
            if name in _ARENA:
                arena._wait_all = wrapped[name]  # type: ignore[index,union-attr]  # set only with an arena
            try:
                t = time.perf_counter_ns()
                for _ in range(iters):
                    op(x)
                times[name].append((time.perf_counter_ns() - t) / iters / 1e3)
            finally:
                if name in _ARENA:
                    del arena._wait_all  # type: ignore[union-attr]  # the class's method again
    fast.all_reduce_spec = spec
    if dist.get_rank() == 0:
        off = statistics.median(times["off"])
        print(f"{dist.get_world_size()} ranks, {rounds} rounds of {iters} all_reduce (8 B) each, "
              f"load average {os.getloadavg()[0]:.1f}")
        for name, got in times.items():
            med = statistics.median(got)
            print(f"  {name:22s} {med:8.2f} us/op  {med / off:6.3f}x off  ({med - off:+.2f} us)", flush=True)
    dist.destroy_process_group()


def _wrapped_waits(arena: Any, fast: Any, spec: Any, x: Any) -> dict[str, Any]:
    """The tcp arena's wait, wrapped twice over (bisect's arena variants): one wrapper
    only passes the call on, the other first writes the all_reduce's entry when the wait
    is the one for this op's own round (the arena's counter ``_seq`` is the target: this
    rank's counter is out, it now waits for its peers'). A bench probe of the arena's
    internals (procgroup_tcp._shm): it needs only ``_wait_all(column, target)`` and ``_seq``."""
    wait_all = arena._wait_all
    coll, append, ns = fast.coll, fast.append, time.perf_counter_ns

    def passed_on(column: int, target: int) -> None:
        wait_all(column, target)

    def after_counter(column: int, target: int) -> None:
        if target == arena._seq:
            entry = (spec, next(coll), None, x.nbytes, x.dtype, ns())
            append(entry)
        wait_all(column, target)

    return {"off, waits wrapped": passed_on, "on, after the counter": after_counter}


def bisect(ranks: int, iters: int, rounds: int) -> None:
    run = os.path.join(os.path.dirname(sys.executable), "procgroup-run")
    subprocess.run([run, "-n", str(ranks), "--no-prefix", __file__, "_bisect", "--iters", str(iters),
                    "--rounds", str(rounds)], check=True, timeout=3600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["instr", "cachesim", "ab", "bisect", "_inner", "_bisect"])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--iters", type=int, default=None, help="ab: 20000; bisect: 2000 per round")
    p.add_argument("--rounds", type=int, default=41)
    p.add_argument("--as-is", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.mode == "_inner":
        _inner(a.calls, a.as_is)
    elif a.mode == "instr":
        instr(a.calls)
    elif a.mode == "cachesim":
        cache_sim(a.calls)
    elif a.mode == "_bisect":
        _bisect_rank(a.iters or 2000, a.rounds)
    elif a.mode == "bisect":
        bisect(int(a.ranks.split(",")[0]), a.iters or 2000, a.rounds)
    else:
        ab(a.pairs, [int(r) for r in a.ranks.split(",")], a.iters or 20000)


if __name__ == "__main__":
    main()
