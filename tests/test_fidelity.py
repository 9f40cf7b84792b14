"""Issue 18, the module-fidelity half: file:// life cycle, mpi ranks from MPI, the small
items (get_num_processes, ``python -m procgroup info``, lazy pydantic, the testing
extra, procgroup-bench's nccl-tests habits). The 2017 suite itself is test_torch2017.py.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import procgroup as pg
import pytest
from _installed import require_mpi
from procgroup.errors import InvalidArgumentError, RendezvousError
from procgroup.rendezvous import FileStore, rendezvous

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60


def _python(code: str, env: dict[str, str] | None = None, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, check=False,
                          timeout=timeout, stdin=subprocess.DEVNULL)


# ------------------------------------------------------------------ file://
def _rank_exits_hard(url: str, queue: mp.Queue) -> None:
    """A 2017-suite rank: join, one all_reduce, leave through os._exit (no destroy)."""
    import numpy as np

    pg.init_process_group("tcp", url, world_size=3, timeout=TIMEOUT)
    arr = np.ones(3)
    pg.all_reduce(arr)
    queue.put((pg.get_rank(), float(arr[0])))
    queue.close()
    queue.join_thread()  # flushed: os._exit skips the feeder thread
    os._exit(0)


def test_file_removed_once_every_rank_read_it(tmp_path: Path) -> None:
    """Ranks that end with os._exit leave no file; the next group on the path works."""
    path = tmp_path / "shared_init_file"
    ctx = mp.get_context("fork")
    for _round in range(2):  # the second group meets on the same path
        queue = ctx.Queue()
        procs = [ctx.Process(target=_rank_exits_hard, args=(f"file://{path}", queue)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(TIMEOUT)
        assert [p.exitcode for p in procs] == [0, 0, 0]
        results = sorted(queue.get(timeout=5) for _ in range(3))
        assert results == [(0, 3.0), (1, 3.0), (2, 3.0)]
        assert not path.exists()


def test_stale_file_of_a_dead_job_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "rdzv"
    # a job of 2 whose only arrived rank died: its process opened the file, then exited
    code = ("from procgroup.rendezvous import FileStore; import os\n"
            f"s = FileStore({str(path)!r}, 2)\ns.add('procgroup/default/rdzv/rank/0', 1)\nos._exit(0)\n")
    assert _python(code).returncode == 0
    assert path.exists()
    with pytest.raises(RendezvousError) as info:
        rendezvous(f"file://{path}", world_size=2, timeout=5)
    msg = str(info.value)
    assert "left over from an earlier job" in msg and "every process that opened it has exited" in msg, msg
    assert f"rm {path}" in msg and "another path" in msg, msg
    assert re.search(r"job [0-9a-f]{12}, created [0-9.]+s ago", msg), msg
    path.unlink()  # what the message says to do
    result = rendezvous(f"file://{path}", world_size=1, timeout=5)
    assert result.rank == 0 and not path.exists()
    result.store.close()


def test_file_store_keeps_working_after_the_path_is_removed(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    a, b = FileStore(path, 2, timeout=5), FileStore(path, 2, timeout=5)
    assert a.fresh and not b.fresh and a.job_id() == b.job_id()
    assert not a.arrived() and b.arrived() and not os.path.exists(path)
    a.set("k", b"v")
    assert b.get("k") == b"v"
    c = FileStore(path, 1, timeout=5)  # a new job on the path: a new file, untouched by a/b
    assert c.fresh and c.job_id() != a.job_id() and c.leftover() is None
    a.close()
    b.close()  # the last of the old job: must not remove the new job's file
    assert os.path.exists(path)
    c.close()
    assert not os.path.exists(path)


# ------------------------------------------------------------------ mpi: ranks from MPI
def test_mpi_contradicting_world_size_is_a_clear_error() -> None:
    """A singleton (no mpiexec) told WORLD_SIZE=3: refused, naming the variable and mpiexec."""
    require_mpi()
    code = ("import procgroup as pg\n"
            "try:\n    pg.init_process_group('mpi', 'env://', timeout=10)\n"
            "except pg.InvalidArgumentError as e:\n    print('ERR', e)\n")
    out = _python(code, {"RANK": "1", "WORLD_SIZE": "3"})
    assert "ERR" in out.stdout, out.stdout + out.stderr
    assert "environment variable WORLD_SIZE=3" in out.stdout and "mpiexec -n 3" in out.stdout, out.stdout
    # without launcher variables, env:// under plain python is a world of 1 (no MASTER_ADDR needed)
    code = ("import procgroup as pg\npg.init_process_group('mpi', 'env://', timeout=10)\n"
            "print('WORLD', pg.get_rank(), pg.get_num_processes())\npg.destroy_process_group()\n")
    out = _python(code)
    assert "WORLD 0 1" in out.stdout, out.stdout + out.stderr


# ------------------------------------------------------------------ small items
def test_get_num_processes_is_get_world_size(tmp_path: Path) -> None:
    pg.init_process_group("tcp", f"file://{tmp_path}/f", rank=0, world_size=1, timeout=TIMEOUT)
    try:
        assert pg.get_num_processes() == pg.get_world_size() == 1
    finally:
        pg.destroy_process_group()
    assert "get_num_processes" in pg.__all__


def test_info_does_not_start_mpi_and_aligns_names() -> None:
    require_mpi()
    code = ("import io, sys\nfrom procgroup.__main__ import info\nb = io.StringIO(); info(b)\n"
            "from mpi4py import MPI\nprint('MPI_INITIALIZED', MPI.Is_initialized())\nprint(b.getvalue())\n")
    out = _python(code)
    assert "MPI_INITIALIZED False" in out.stdout, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if "devices=" in line]
    assert len({line.index("devices=") for line in rows}) == 1, rows  # one column, however long a name
    table = out.stdout.split("not supported):\n", 1)[1].splitlines()
    assert len({len(line) for line in table if line.strip()}) == 1, table


def test_import_does_not_load_pydantic_and_errors_use_our_words() -> None:
    code = ("import sys, procgroup\nprint('PYDANTIC', any(m.split('.')[0] == 'pydantic' for m in sys.modules))\n"
            "try:\n    procgroup.init_process_group('tcp', 'env://', world_size=0)\n"
            "except procgroup.InvalidArgumentError as e:\n    print('ERR', e)\n")
    out = _python(code)
    assert "PYDANTIC False" in out.stdout, out.stdout + out.stderr
    assert "argument world_size=0: must be positive" in out.stdout, out.stdout
    with pytest.raises(InvalidArgumentError) as info:
        pg.init_process_group("tcp", "env://", rank=-7)
    assert "must be >= -1" in str(info.value) and "Input should" not in str(info.value)
    out = _python("import procgroup\nprocgroup.init_process_group('tcp', 'env://', timeout=5)\n",
                  {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"})
    assert "MASTER_PORT='99999' is invalid: must be <= 65535" in out.stderr, out.stderr
    assert "Input should" not in out.stderr and "pydantic" not in out.stderr


def test_testing_extra_and_no_pointer_outside_the_wheel() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^testing = \["pytest>=7"\]', pyproject, re.MULTILINE), "the testing extra"
    for f in (ROOT / "core" / "procgroup" / "testing").glob("*.py"):
        assert not re.search(r"\btests/test_\w+\.py", f.read_text()), f"{f.name} points at a test file outside the wheel"


# ------------------------------------------------------------------ procgroup-bench
def test_bench_nccl_tests_spellings() -> None:
    from procgroup.bench._options import parse_options

    o = parse_options(["-np", "3", "-b", "1K", "-e", "16K", "-f", "4", "-n", "7", "-w", "2", "-c", "0"])
    assert (o.nprocs, o.sizes, o.iters, o.warmup, o.check) == (3, [1024, 4096, 16384], 7, 2, False)
    o = parse_options(["--minbytes", "8", "--maxbytes", "8", "--stepfactor", "2", "--warmup_iters", "0"])
    assert (o.sizes, o.warmup, o.check, o.nprocs) == ([8], 0, True, 2)
    with pytest.raises(InvalidArgumentError, match="-c/--check must be 0 or 1"):
        parse_options(["-c", "yes"])


def test_bench_report_columns_json_csv(tmp_path: Path) -> None:
    import io
    import math

    from procgroup.bench._report import (
        COLUMNS,
        Record,
        print_table,
        write_csv,
        write_json,
    )

    recs = [Record("all_reduce", "tcp", 2, 1024, 256, "float32", 5, 1, 10.123456, 9.0, 11.0, 0.101234567,
                   0.101234567, 1.0),
            Record("all_gather", "tcp", 2, 1024, 128, "float32", 5, 1, 20.0, 19.0, 21.0, 0.05, 0.025, math.nan),
            Record("all_gather", "gloo", 2, 1024, 128, "float32", 0, 0, *([math.nan] * 6), status="no data")]
    meta = {"world_size": 2, "dtype": "float32", "variants": ["tcp", "gloo"], "reference": "tcp", "check": True,
            "versions": {"procgroup": "0.1.0", "numpy": "?"}}
    out = io.StringIO()
    print_table(recs, meta, out)
    text = out.getvalue()
    assert "#wrong" in text and "place" in text and " out " in text
    assert "# tcp: Avg bus bandwidth    : 0.1012 GB/s" in text and "# Avg bus bandwidth    :" in text
    write_json(str(tmp_path / "r.json"), recs, meta)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["meta"]["versions"]["numpy"] not in ("?", "unknown")  # from the installed metadata
    first = data["results"][0]
    assert isinstance(first["time_us"], float) and isinstance(first["nbytes"], int)
    assert (first["place"], first["wrong"]) == ("in", 0) and data["results"][2]["wrong"] is None
    assert data["results"][1]["ratio"] is None  # NaN -> null, never a string
    write_csv(str(tmp_path / "r.csv"), recs)
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines[0].split(",") == COLUMNS
    # link_fraction is empty without --link-rate
    assert ",10.12,9.0,11.0,0.1012,0.1012,1.0,ok,,in,0" in lines[1], lines[1]


def test_bench_plot_log_busbw(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from procgroup.bench._plot import write_plot
    from procgroup.bench._report import Record

    recs = [Record("all_reduce", v, 2, n, n // 4, "float32", 5, 1, 10.0 + n / 1e3, 9.0, 11.0, 0.1, n / 1e4, 1.0)
            for v in ("tcp", "mpi") for n in (1024, 4096)]
    meta = {"world_size": 2, "dtype": "float32", "variants": ["tcp", "mpi"], "command": ["procgroup-bench", "--log-busbw"]}
    started = time.monotonic()
    write_plot(str(tmp_path / "p.png"), recs, meta)
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG", time.monotonic() - started
