"""all_reduce through procgroup-gloo on each engine vs raw pygloo vs torch.distributed's gloo.

Usage (from the repository root, dev venv with pygloo; the torch contenders run in a
Python with torch: --torch-python, else .venv313, .venv-bench, .venv-torch, the first
whose torch has gloo; the newest torch is the baseline, its version is printed)::

    .venv/bin/python bench/gloo_compare.py                 # 8 B, 4 MiB, 64 MiB; 2 ranks
    .venv/bin/python bench/gloo_compare.py --rounds 5 --markdown

Contenders: procgroup-gloo on the pygloo engine (this Python), procgroup-gloo on the
torch engine (the torch Python), raw pygloo (this Python) and torch.distributed's gloo
(the torch Python). Each runs as its own 2-rank job (real processes on loopback, file://
rendezvous), in place on float32 arrays, ring algorithm; rounds alternate the
contenders so a noisy neighbour hurts all alike. Per size we report the median time of
one all_reduce on rank 0 (best round), the algorithm bandwidth (bytes/time) and each
engine's speed relative to the library it drives (1.00 = same).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"8 B": 8, "4 MiB": 4 << 20, "64 MiB": 64 << 20}
CONTENDERS = ("procgroup-gloo", "procgroup-gloo-torch", "pygloo", "torch-gloo")
#: The gloo engine each procgroup contender runs on ($PROCGROUP_GLOO_ENGINE).
ENGINE = {"procgroup-gloo": "pygloo", "procgroup-gloo-torch": "torch"}


def _iterations(nbytes: int) -> tuple[int, int]:
    """(warm-up, timed) iterations: enough for a stable median without hogging 2 cores."""
    if nbytes <= 1 << 16:
        return 200, 2000
    if nbytes <= 8 << 20:
        return 5, 60
    return 2, 12


# ------------------------------------------------------------------ workers (one per rank)
def _time_loop(step: Callable[[], None], nbytes: int) -> list[float]:
    warm, timed = _iterations(nbytes)
    for _ in range(warm):
        step()
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _worker_procgroup(rank: int, size: int, rdv: str, sizes: list[int]) -> dict[int, list[float]]:
    import numpy as np
    import procgroup as pg

    pg.init_process_group("gloo", f"file://{rdv}", rank=rank, world_size=size)
    try:
        out = {}
        for nbytes in sizes:
            arr = np.ones(nbytes // 4, dtype=np.float32)
            out[nbytes] = _time_loop(lambda arr=arr: pg.all_reduce(arr), nbytes)
            pg.barrier()
        return out
    finally:
        pg.destroy_process_group()


def _worker_pygloo(rank: int, size: int, rdv: str, sizes: list[int]) -> dict[int, list[float]]:
    import numpy as np
    import pygloo

    os.makedirs(rdv, exist_ok=True)
    ctx = pygloo.rendezvous.Context(rank, size)
    dev = pygloo.transport.tcp.CreateDevice(pygloo.transport.tcp.attr("127.0.0.1"))
    ctx.connectFullMesh(pygloo.rendezvous.FileStore(rdv), dev)
    f32, ring, add = pygloo.glooDataType_t.glooFloat32, pygloo.allreduceAlgorithm.RING, pygloo.ReduceOp.SUM
    out = {}
    for nbytes in sizes:
        arr = np.ones(nbytes // 4, dtype=np.float32)
        ptr = arr.ctypes.data

        def step(ptr: int = ptr, count: int = arr.size) -> None:
            pygloo.allreduce(ctx, ptr, ptr, count, f32, add, ring)

        out[nbytes] = _time_loop(step, nbytes)
        pygloo.barrier(ctx)
    return out


def _worker_torch(rank: int, size: int, rdv: str, sizes: list[int]) -> dict[int, list[float]]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rdv}", rank=rank, world_size=size)
    try:
        out = {}
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, dtype=torch.float32)
            out[nbytes] = _time_loop(lambda t=t: dist.all_reduce(t), nbytes)
            dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


WORKERS = {"procgroup-gloo": _worker_procgroup, "procgroup-gloo-torch": _worker_procgroup,
           "pygloo": _worker_pygloo, "torch-gloo": _worker_torch}


def _worker_main(argv: list[str]) -> None:
    kind, rank, size, rdv, sizes = argv[0], int(argv[1]), int(argv[2]), argv[3], [int(s) for s in argv[4].split(",")]
    result = WORKERS[kind](rank, size, rdv, sizes)
    if rank == 0:
        print("RESULT " + json.dumps({str(k): v for k, v in result.items()}), flush=True)


# ------------------------------------------------------------------ driver
def _run_job(kind: str, python: str, sizes: list[int], ranks: int, timeout: float) -> dict[int, list[float]]:
    tmp = tempfile.mkdtemp(prefix=f"gloo-bench-{kind}-")
    try:
        rdv = os.path.join(tmp, "rdv")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "core"), str(ROOT / "backends" / "tcp"),
                                                           str(ROOT / "backends" / "gloo"),
                                                           os.environ.get("PYTHONPATH", "")]))
        if kind in ENGINE:
            env["PROCGROUP_GLOO_ENGINE"] = ENGINE[kind]
        cmd = [python, str(Path(__file__).resolve()), "--worker", kind]
        procs = [subprocess.Popen(cmd + [str(r), str(ranks), rdv, ",".join(map(str, sizes))], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(ranks)]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=timeout))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"{kind}: benchmark job ran past {timeout}s") from None
        for p, (_, err) in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(f"{kind}: a rank failed (exit {p.returncode}):\n{err[-3000:]}")
        line = next(ln for ln in outs[0][0].splitlines() if ln.startswith("RESULT "))
        return {int(k): v for k, v in json.loads(line[len("RESULT "):]).items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _torch_python(given: str | None) -> str | None:
    for cand in ([given] if given else []) + [str(ROOT / v / "bin" / "python")
                                               for v in (".venv313", ".venv-bench", ".venv-torch")]:
        if cand and os.path.exists(cand):
            ok = subprocess.run([cand, "-c", "import torch.distributed as d; assert d.is_gloo_available()"],
                                capture_output=True, timeout=120, check=False).returncode == 0
            if ok:
                return cand
    return None


def _fmt_time(sec: float) -> str:
    return f"{sec * 1e6:.1f} us" if sec < 1e-3 else f"{sec * 1e3:.2f} ms"


def _fmt_bw(nbytes: int, sec: float) -> str:
    return f"{nbytes / sec / 1e9:.3f} GB/s" if nbytes >= 1 << 20 else f"{nbytes / sec / 1e6:.3f} MB/s"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--worker":
        _worker_main(args[1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the contenders")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--torch-python", help="a Python with torch (default: .venv-bench, then .venv-torch)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    opts = ap.parse_args(args)

    sizes = list(SIZES.values())
    torch_py = _torch_python(opts.torch_python)
    here = sys.executable if _has(sys.executable, "pygloo") else None
    pythons = {"procgroup-gloo": here, "procgroup-gloo-torch": torch_py, "pygloo": here, "torch-gloo": torch_py}
    for name, py in (("pygloo", here), ("torch", torch_py)):
        if py is not None:
            print(f"# {name} {_module_version(py, name)} (Python {_module_version(py, 'sys')}: {py})")
    runs: dict[str, list[dict[int, list[float]]]] = {k: [] for k in CONTENDERS}
    for rnd in range(opts.rounds):
        for kind in CONTENDERS:
            py = pythons[kind]
            if py is None:
                continue
            print(f"round {rnd + 1}/{opts.rounds}: {kind} ...", file=sys.stderr, flush=True)
            runs[kind].append(_run_job(kind, py, sizes, opts.ranks, opts.timeout))
    best: dict[str, dict[int, float]] = {
        kind: {n: min(statistics.median(r[n]) for r in rs) for n in sizes} for kind, rs in runs.items() if rs
    }
    _print_table(best, opts.markdown, opts.ranks, opts.rounds)
    if torch_py is None:
        print("torch contenders skipped: no Python with torch found (scripts/setup-dev.sh 3.13)", file=sys.stderr)
    if here is None:
        print("pygloo contenders skipped: pygloo is not importable here (use the 3.10 venv)", file=sys.stderr)
    return 0


def _has(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True, timeout=120, check=False).returncode == 0


def _module_version(python: str, module: str) -> str:
    code = ("import platform; print(platform.python_version())" if module == "sys"
            else f"import {module}; print(getattr({module}, '__version__', '?'))")
    if module == "pygloo":
        code = "from importlib import metadata; print(metadata.version('pygloo'))"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    return proc.stdout.strip() or "?"


def _print_table(best: dict[str, dict[int, float]], markdown: bool, ranks: int, rounds: int) -> None:
    kinds = [k for k in CONTENDERS if k in best]
    pairs = [(ours, raw) for ours, raw in (("procgroup-gloo", "pygloo"), ("procgroup-gloo-torch", "torch-gloo"))
             if {ours, raw} <= best.keys()]
    head = ["size"] + [f"{k} (median, bandwidth)" for k in kinds] + [f"{o} / {r} speed" for o, r in pairs]
    rows = []
    for label, n in SIZES.items():
        cells = [label] + [f"{_fmt_time(best[k][n])}, {_fmt_bw(n, best[k][n])}" for k in kinds]
        rows.append(cells + [f"{best[r][n] / best[o][n]:.2f}x" for o, r in pairs])
    print(f"all_reduce SUM float32 in place, {ranks} ranks on one host, ring; best of {rounds} rounds' medians")
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join("---" for _ in head) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    raise SystemExit(main())
