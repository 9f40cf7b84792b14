"""procgroup-bench: output shape only (a benchmark is a tool, never a timed test).

One tiny sweep (2 ranks over tcp, 2 sizes, few iterations) is run once per module as a
real job of real processes; the checks read its table, JSON, CSV and plot. No check
looks at how fast anything was, only that every number is there and consistent.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from procgroup.bench._options import parse_options
from procgroup.bench._report import COLUMNS
from procgroup.bench._sweep import OPS, bandwidths, parse_size, size_sweep
from procgroup.errors import InvalidArgumentError

OPS_RUN = ["all_reduce", "all_gather", "pingpong"]
SIZES = [1024, 65536]
JOB_TIMEOUT = 240


def _bench(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "procgroup.bench", *args], capture_output=True, text=True,
                          check=False, timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]  # kwargs: subprocess.run's own


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Run the tool once: -n 2 on tcp, two sizes, three ops, every output format."""
    out = tmp_path_factory.mktemp("bench")
    args = ["-np", "2", "--backend", "tcp", "--op", ",".join(OPS_RUN), "--sizes", "1K,64K",
            "--iters", "3", "--warmup", "1", "--timeout", "60", "--job-timeout", "200", "--link-rate", "1Gbit",
            "--json", str(out / "r.json"), "--csv", str(out / "r.csv"), "--plot", str(out / "r.png")]
    proc = _bench(args)
    assert proc.returncode == 0, f"procgroup-bench failed:\n{proc.stdout}\n{proc.stderr}"
    return {"proc": proc, "dir": out}


def test_table_printed(sweep: dict[str, object]) -> None:
    proc = sweep["proc"]
    assert isinstance(proc, subprocess.CompletedProcess)
    text = proc.stdout
    assert "procgroup-bench: 2 ranks" in text
    # the topology it found (both ranks on this host) and the link column of --link-rate
    assert "# topology: 1 host x 2 ranks per host (shape 1x2)" in text
    assert "# link = busbw / the link rate (1 Gbit/s = 0.125 GB/s)" in text
    for op in OPS_RUN:
        assert f"## {op}" in text
    for header in ("size", "variant", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "ratio", "link"):
        assert header in text
    rows = [line.split() for line in text.splitlines() if line.strip().split()[1:2] == ["KiB"]]
    assert len(rows) == len(OPS_RUN) * len(SIZES)
    assert all(r[2] == "tcp" for r in rows)
    assert "n/a" not in text
    # the progress bar goes to stderr, never into the table
    assert "[" in proc.stderr and "/" in proc.stderr
    assert "[#" not in text


def test_json_columns_and_values(sweep: dict[str, object]) -> None:
    data = json.loads((Path(str(sweep["dir"])) / "r.json").read_text())
    meta, results = data["meta"], data["results"]
    assert data["columns"] == COLUMNS
    assert meta["world_size"] == 2 and meta["variants"] == ["tcp"] and meta["reference"] == "tcp"
    assert meta["launcher"].startswith("procgroup-bench -np 2")
    assert "max over ranks" in meta["timing"] and "median" in meta["timing"]
    assert meta["topology"]["shape"] == "1x2" and meta["topology"]["placement"] == [[0, 1]]
    assert meta["link_rate_Bps"] == 125e6
    assert {(r["op"], r["nbytes"]) for r in results} == {(op, s) for op in OPS_RUN for s in SIZES}
    for r in results:
        assert set(r) == set(COLUMNS)
        assert r["status"] == "ok" and r["variant"] == "tcp" and r["iters"] == 3
        assert 0 < r["min_us"] <= r["time_us"] <= r["max_us"]
        algbw, busbw = bandwidths(r["op"], r["nbytes"], r["time_us"] / 1e6, 2)
        assert math.isclose(r["algbw_gbps"], algbw, rel_tol=1e-9)
        assert math.isclose(r["busbw_gbps"], busbw, rel_tol=1e-9)
        assert math.isclose(r["link_fraction"], busbw * 1e9 / 125e6, rel_tol=1e-9)
        assert r["ratio"] == 1.0  # the only variant is its own reference
        assert r["count"] * 4 == r["nbytes"] and r["dtype"] == "float32"


def test_csv_matches_json(sweep: dict[str, object]) -> None:
    d = Path(str(sweep["dir"]))
    with open(d / "r.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
        rows = list(reader)
    results = json.loads((d / "r.json").read_text())["results"]
    assert len(rows) == len(results)
    for row, r in zip(rows, results):
        assert (row["op"], row["variant"], int(row["nbytes"])) == (r["op"], r["variant"], r["nbytes"])
        # the CSV is rounded (times to 0.01 us); the JSON keeps full precision
        assert abs(float(row["time_us"]) - r["time_us"]) <= 0.005 + 1e-9


def test_plot_written(sweep: dict[str, object]) -> None:
    # matplotlib comes with the test extra (scripts/setup-dev.sh installs it)
    png = Path(str(sweep["dir"])) / "r.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_under_procgroup_run_it_does_not_spawn(tmp_path: Path) -> None:
    """Started by a launcher (RANK/WORLD_SIZE set), each process is one rank of that job."""
    run = Path(sys.executable).with_name("procgroup-run")  # installed with procgroup, next to python
    assert run.exists(), f"the procgroup-run console script is missing next to {sys.executable}"
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [str(run), "-n", "2", "--no-prefix", "--timeout", "200", "-m", "procgroup.bench", "--sizes", "4K",
         "--iters", "2", "--warmup", "1", "-q", "--json", str(out)],
        capture_output=True, text=True, check=False, timeout=JOB_TIMEOUT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads(out.read_text())["meta"]
    assert meta["world_size"] == 2
    assert meta["launcher"] == "external (RANK/WORLD_SIZE set)"
    assert proc.stdout.count("## all_reduce") == 1  # only rank 0 prints the table


def test_link_rate_parsing() -> None:
    """Bits per second as links are quoted (decimal prefixes); bytes with "B/s"."""
    assert parse_options(["--link-rate", "1Gbit"]).link_rate == 125e6
    assert parse_options(["--link-rate", "100gbit/s"]).link_rate == 12.5e9
    assert parse_options(["--link-rate", "12.5GB/s"]).link_rate == 12.5e9
    assert parse_options([]).link_rate is None


def test_topology_shapes() -> None:
    from procgroup.bench._rank import topology
    from procgroup.bench._report import describe_topology

    block = topology(["a", "a", "b", "b", "c", "c", "d", "d"])
    assert block["shape"] == "4x2" and describe_topology(block) == "4 hosts x 2 ranks per host"
    rr = topology(["a", "b", "a", "b"])
    assert rr["placement"] == [[0, 2], [1, 3]] and rr["shape"] == "2x2"
    uneven = topology(["a", "b", "b", "b", "c", "c"])
    assert uneven["shape"] == "3x(1,3,2)" and describe_topology(uneven) == "3 hosts x (1, 3, 2) ranks"


@pytest.mark.parametrize("args, words", [
    (["--op", "allreduce,nope"], "unknown op 'nope'"),
    (["--max-bytes", "12Q"], "bad size '12Q'"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "below --min-bytes"),
    (["--factor", "1"], "--factor must be greater than 1"),
    (["--iters", "0"], "--iters must be at least 1"),
    (["--compare", "tensorflow"], "choose torch and/or raw"),
    (["--timeout", "-3"], "--timeout must be positive"),
    (["--link-rate", "fast"], "--link-rate 'fast': write a rate such as 1Gbit"),
    (["--link-rate", "0gbit"], "the rate must be positive"),
])
def test_bad_options_are_clear_errors(args: list[str], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        parse_options(args)


def test_bad_option_exits_before_spawning() -> None:
    proc = _bench(["-np", "2", "--op", "nope"])
    assert proc.returncode == 2
    assert "procgroup-bench: error: unknown op 'nope'" in proc.stderr
    assert proc.stdout == ""


def test_sweep_and_bandwidth_definitions() -> None:
    assert parse_size("256M") == 256 * 2**20 and parse_size("8") == 8 and parse_size("1KiB") == 1024
    assert size_sweep(8, parse_size("256M"), 4)[-1] == 128 * 2**20
    assert size_sweep(16, 64 * 2**20, 4) == [16 * 4**k for k in range(12)]
    n, nbytes, secs = 4, 10**9, 2.0
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0, "pingpong": 1.0}
    assert set(factors) == set(OPS)
    for op, factor in factors.items():
        algbw, busbw = bandwidths(op, nbytes, secs, n)
        assert math.isclose(algbw, nbytes / secs / 1e9)
        assert math.isclose(busbw, algbw * factor)


# --------------------------------------------------------------------- master-worker mode
def test_master_worker_mode(tmp_path: Path) -> None:
    """``procgroup-bench master-worker``: every measure is there, and 200 in-place ops on
    one stream give the exact value (per-stream order)."""
    out = tmp_path / "mw.json"
    proc = _bench(["master-worker", "--reps", "1", "--size", "64K", "--async-ops", "200", "--round-trips", "20",
                   "--json", str(out)])
    assert proc.returncode == 0, f"procgroup-bench master-worker failed:\n{proc.stdout}\n{proc.stderr}"
    assert "procgroup-bench master-worker: backend tcp" in proc.stdout
    for label in ("round trip", "async in-place ops", "64 KiB get", "64 KiB worker -> worker",
                  "64 KiB send/recv, 2-rank job", "64 KiB send/recv, the same 2 workers"):
        assert label in proc.stdout
    result = json.loads(out.read_text())
    assert result["backend"] == "tcp" and result["size"] == 65536 and result["async_ops"] == 200
    p = result["procgroup"]
    assert p["async_exact"] is True
    for key in ("round_trip_s", "async_ops_per_s", "get_GBps", "to_GBps", "sendrecv_GBps", "workers_sendrecv_GBps"):
        assert isinstance(p[key], float) and math.isfinite(p[key]) and p[key] > 0, key


def test_master_worker_mode_rejects_bad_options() -> None:
    proc = _bench(["master-worker", "--size", "10"])
    assert proc.returncode == 2 and "--size must be a multiple of 4 bytes" in proc.stderr
    proc = _bench(["master-worker", "--reps", "0"])
    assert proc.returncode == 2 and "--reps must be at least 1" in proc.stderr
