"""procgroup-run --keep-going: the survivors of a failed rank run on (issue 17).

Real launcher processes start real ranks; one rank is killed (SIGKILL) mid-run. With
--keep-going the others shrink and finish; the exit status and summary still name the
failed rank. The example training loop ends with the loss of a run that had fewer
ranks from the start.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from procgroup._launch.options import LaunchOptions
from procgroup.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "survive_sgd.py"
SAFETY = 180


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "procgroup.run", *args], capture_output=True, text=True, check=False,
                          timeout=SAFETY, stdin=subprocess.DEVNULL)


def final_loss(out: str) -> tuple[float, str]:
    found = re.search(r"final loss (\S+) on (\d+ of \d+) ranks", out)
    assert found, out
    return float(found.group(1)), found.group(2)


def test_sgd_survives_a_killed_rank_with_the_loss_of_a_smaller_run() -> None:
    killed = launch("--nproc-per-node", "4", "--keep-going", str(EXAMPLE), "--kill-rank", "2", "--kill-step", "20")
    assert killed.returncode != 0, killed.stderr  # a rank failed: the job says so
    assert "rank 2" in killed.stderr and "SIGKILL" in killed.stderr, killed.stderr
    assert "failed ranks: [2]" in killed.stderr, killed.stderr
    loss_after, where = final_loss(killed.stdout)
    assert where == "3 of 4"
    smaller = launch("--nproc-per-node", "3", str(EXAMPLE))
    assert smaller.returncode == 0, smaller.stderr
    loss_smaller, where = final_loss(smaller.stdout)
    assert where == "3 of 3"
    assert loss_after == pytest.approx(loss_smaller, rel=1e-9)


def test_without_keep_going_a_failure_stops_every_rank() -> None:
    # the survivors would train for hours: only the launcher stopping them ends the job
    out = launch("--nproc-per-node", "3", str(EXAMPLE), "--kill-rank", "1", "--kill-step", "5",
                 "--steps", "100000000")
    assert out.returncode != 0
    assert "final loss" not in out.stdout  # the survivors were stopped, nobody finished
    assert "root cause: rank 1" in out.stderr, out.stderr


def test_keep_going_excludes_restarts() -> None:
    with pytest.raises(InvalidArgumentError, match="--keep-going and --max-restarts"):
        LaunchOptions(target="x.py", keep_going=True, max_restarts=1).validate()
