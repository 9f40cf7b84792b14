"""The culprit report on real stuck and failing jobs, under procgroup-run and without it.

The jobs live in tests/flight_jobs/ (four tcp ranks, op timeout of a few seconds):
asleep.py (rank 2 sleeps in its data loader before the 5th all_reduce), cycle.py (rank 1
receives from rank 2, which is in a barrier), skipped.py (rank 2 skips an all_reduce and
goes on to a broadcast), first_failure.py (rank 1 raises; rank 0 sees it and leaves; the
others must still hear of rank 1). Each assertion checks what a user reads: the culprit
rank, the op and its number, and the file:line where the culprit is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)
JOBS = Path(__file__).parent / "flight_jobs"
SAFETY = 150


def line_of(script: str, text: str) -> str:
    """'asleep.py:11': where ``text`` stands in the job's script."""
    for i, line in enumerate((JOBS / script).read_text().splitlines(), 1):
        if text in line:
            return f"{script}:{i}"
    raise AssertionError(text)


def launcher(script: str, *, timeout: float = 4.0, nproc: int = 4) -> list[str]:
    return [sys.executable, "-m", "procgroup.run", "-n", str(nproc), "--grace-period", "2", str(JOBS / script)]


def env(timeout: float) -> dict[str, str]:
    return {**os.environ, "PROCGROUP_TIMEOUT": str(timeout)}


def run_job(script: str, timeout: float = 4.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(launcher(script), capture_output=True, text=True, timeout=SAFETY,
                          env=env(timeout), check=False)


def root_cause(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("procgroup-run: root cause:")]
    assert lines, stderr[-3000:]
    return lines[0]


def test_a_sleeping_rank_is_named_live_and_at_the_end(tmp_path: Path) -> None:
    """The report on demand (SIGUSR1 to procgroup-run, the job going on), then the root
    cause once the waiting ranks time out: rank 2, never in all_reduce #5, in time.sleep."""
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(launcher("asleep.py"), stdout=subprocess.PIPE, stderr=err, text=True,
                                env=env(8.0))
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + SAFETY
            for line in proc.stdout:
                if line.startswith("[rank0]: step 4"):
                    break
                assert time.monotonic() < deadline
            time.sleep(1.5)  # rank 0 is in all_reduce #5, rank 2 in its data loader
            proc.send_signal(signal.SIGUSR1)
            proc.stdout.read()
            code = proc.wait(timeout=SAFETY)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = err_path.read_text()
    sleep_at = line_of("asleep.py", "time.sleep(60)")
    live = stderr.split("flight recorder report (the job goes on):", 1)
    assert len(live) == 2, stderr[-3000:]
    live_report = live[1].split("procgroup-run: job failed", 1)[0]
    assert "culprit: rank 2 never entered all_reduce #5 of the world group" in live_report
    assert sleep_at in live_report and "time.sleep(60)" in live_report
    assert "rank 0: waiting in all_reduce #5 of the world group" in live_report
    assert code != 0
    cause = root_cause(stderr)
    assert "rank 2 never entered all_reduce #5 of the world group" in cause
    assert sleep_at in cause
    assert "first rank to exit: rank 2" not in stderr  # the first to give up is not blamed


def test_a_wait_for_cycle_names_the_receive() -> None:
    res = run_job("cycle.py")
    cause = root_cause(res.stderr)
    recv_at, barrier_at = line_of("cycle.py", "dist.recv("), line_of("cycle.py", "dist.barrier()")
    assert "rank 1 is in a wait-for cycle: its recv from rank 2" in cause and recv_at in cause
    assert "rank 2 is in barrier #2 of the world group" in cause and barrier_at in cause
    assert "wait-for cycle: rank 1 in recv from rank 2" in res.stderr


def test_a_rank_that_skipped_a_collective_is_out_of_step() -> None:
    res = run_job("skipped.py")
    cause = root_cause(res.stderr)
    assert "rank 2 is out of step on the world group: its collective #5 is broadcast" in cause
    assert line_of("skipped.py", "dist.broadcast(") in cause
    assert "all_reduce (0, 1, 3)" in cause and line_of("skipped.py", "dist.all_reduce(") in cause


def test_the_first_failure_is_named_by_every_survivor() -> None:
    res = run_job("first_failure.py", timeout=10.0)
    said = {}
    for line in res.stdout.splitlines():
        _, _, text = line.partition("]: ")
        if text.startswith("survivor "):
            said[int(text.split()[1])] = text
    assert sorted(said) == [0, 2, 3], res.stdout[-3000:]
    raised_at = line_of("first_failure.py", 'raise ValueError("bad batch on rank 1")')
    for rank, line in said.items():
        assert "ValueError: bad batch on rank 1" in line and raised_at in line, line
        if rank != 0:  # they saw rank 0 leave: the error still names rank 1 first (tcp's own rule)
            assert "error: 'recv: rank 1 left first (rank 1 has left the group" in line, line
    assert "root cause: rank 1 (node 0, local rank 1" in res.stderr


def asleep_without_launcher(rank: int, size: int) -> str:
    """asleep.py without procgroup-run: the waiting ranks' own errors carry the culprit."""
    import procgroup as dist

    x = np.ones(2, dtype=np.float32)
    for step in range(6):
        if rank == 2 and step == 4:
            time.sleep(8)  # MARK-sleep
        try:
            dist.all_reduce(x)
        except dist.errors.ProcGroupError as exc:
            return str(exc)
    return "completed"


def test_without_the_launcher_the_timeout_names_the_culprit() -> None:
    results = spawn(asleep_without_launcher, 4, "tcp", init_method="tcp", timeout=3.0, job_timeout=120)
    here = Path(__file__).read_text().splitlines()
    sleep_at = f"test_culprit.py:{next(i for i, line in enumerate(here, 1) if '# MARK-sleep' in line)}"
    for rank in (0, 1, 3):
        msg = results[rank]
        assert "timed out" in msg, msg
        assert "culprit: rank 2 never entered all_reduce #5 of the world group" in msg, msg
        assert sleep_at in msg, msg
