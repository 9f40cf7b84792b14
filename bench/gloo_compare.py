"""all_reduce through procgroup-gloo vs raw pygloo vs torch.distributed's gloo, side by side.

Usage (from the repository root, dev venv; torch comes from .venv-bench, see
scripts/setup-bench-venv.sh, because torch 2.13 has CPU wheels for CPython 3.11 while
pygloo has them only for 3.8-3.10)::

    .venv/bin/python bench/gloo_compare.py                 # 8 B, 4 MiB, 64 MiB; 2 ranks
    .venv/bin/python bench/gloo_compare.py --rounds 5 --markdown

Each contender runs as its own 2-rank job (real processes on loopback, file://
rendezvous), in place on float32 arrays, ring algorithm; rounds alternate the
contenders so a noisy neighbour hurts all three alike. Per size we report the median
time of one all_reduce on rank 0 (best round), the algorithm bandwidth (bytes/time)
and procgroup-gloo's speed relative to raw pygloo (1.00 = same; goal >= 0.95).
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
CONTENDERS = ("procgroup-gloo", "pygloo", "torch-gloo")


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


WORKERS = {"procgroup-gloo": _worker_procgroup, "pygloo": _worker_pygloo, "torch-gloo": _worker_torch}


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
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "core"), os.environ.get("PYTHONPATH", "")]))
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
    for cand in ([given] if given else []) + [str(ROOT / ".venv-bench" / "bin" / "python"),
                                               str(ROOT / ".venv-torch" / "bin" / "python")]:
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
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the three contenders")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--torch-python", help="a Python with torch (default: .venv-bench, then .venv-torch)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    opts = ap.parse_args(args)

    sizes = list(SIZES.values())
    pythons = {"procgroup-gloo": sys.executable, "pygloo": sys.executable, "torch-gloo": _torch_python(opts.torch_python)}
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
    if pythons["torch-gloo"] is None:
        print("torch-gloo skipped: no Python with torch found (run scripts/setup-bench-venv.sh)", file=sys.stderr)
    return 0


def _print_table(best: dict[str, dict[int, float]], markdown: bool, ranks: int, rounds: int) -> None:
    kinds = [k for k in CONTENDERS if k in best]
    head = ["size"] + [f"{k} (median, bandwidth)" for k in kinds] + ["procgroup-gloo / pygloo speed"]
    rows = []
    for label, n in SIZES.items():
        cells = [label] + [f"{_fmt_time(best[k][n])}, {_fmt_bw(n, best[k][n])}" for k in kinds]
        ratio = best["pygloo"][n] / best["procgroup-gloo"][n] if {"pygloo", "procgroup-gloo"} <= best.keys() else float("nan")
        rows.append(cells + [f"{ratio:.2f}x"])
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
