"""The mpi backend and a death (issue 17), on a real mpiexec with real processes.

MPI's own way for survivors to go on is ULFM. It is not usable with the MPI libraries
procgroup is tested with (docs/fault-tolerance.md, "mpi"; ``bench/ulfm_probe.py`` shows
what each library answered), so on mpi:

- ``revoke``, ``agree`` and ``shrink`` raise UnsupportedOperationError, saying which MPI
  library and mpi4py this process runs on, why ULFM is not usable there, and what to
  use instead; refusing changes nothing, the group works on;
- a death under mpiexec ends the whole job promptly (the launcher's clean-up), never a
  hang: the op timeout (600 s) is far beyond the test's, so a survivor left waiting
  would fail it;
- ``procgroup-run --backend mpi --keep-going`` is refused before any rank starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _installed import require_mpi
from test_survive import _exact_ops

import procgroup as pg
from procgroup._launch.options import LaunchOptions
from procgroup.errors import InvalidArgumentError, UnsupportedOperationError
from procgroup.testing import mpiexec_command, spawn

#: Guards each mpiexec run; a job that waited for the op timeout (600 s) would exceed it.
SAFETY = 90
pytestmark = pytest.mark.timeout(2 * SAFETY)


@pytest.fixture(autouse=True)
def _mpi_installed() -> None:
    require_mpi()


def refusals(rank: int, size: int) -> dict[str, object]:
    """Every survival call on the world and on a sub-group raises the same clear error;
    afterwards both still give exact results."""
    import mpi4py
    from mpi4py import MPI

    sub = pg.new_group([0, 1, 2])
    calls = [("shrink", lambda: pg.shrink(timeout=5)), ("agree", lambda: pg.agree(True, timeout=5)),
             ("revoke", pg.revoke)]
    if rank in sub.ranks:
        calls += [("shrink(sub)", lambda: pg.shrink(sub, timeout=5)),
                  ("agree(sub)", lambda: pg.agree(False, sub, timeout=5)),
                  ("revoke(sub)", lambda: pg.revoke(sub))]
    messages = {}
    for name, call in calls:
        with pytest.raises(UnsupportedOperationError) as info:
            call()
        messages[name] = str(info.value)
    assert len(set(messages.values())) == 1, messages
    message = messages["shrink"]
    library = " ".join(MPI.Get_library_version().split()[:3]).replace(" Version:", "").rstrip(",")
    bound = MPI.ERR_PROC_FAILED != MPI.ERR_UNKNOWN
    for part in ("ULFM", library, f"mpi4py {mpi4py.__version__}", "use the tcp or gloo backend"):
        assert part in message, (part, message)
    assert ("does not bind" in message) == (not bound), message
    assert pg.failed_ranks() == ()
    if rank in sub.ranks:
        assert pg.failed_ranks(sub) == ()
        x = np.array([rank + 1.0])
        pg.all_reduce(x, group=sub)
        assert x[0] == 6.0
    result = _exact_ops(rank, list(range(size)))  # the refusals left the world as it was
    return {**result, "message": message}


def test_revoke_agree_shrink_are_refused_saying_why() -> None:
    results = spawn(refusals, 4, "mpi", launcher="mpiexec", init_method=None, timeout=60, job_timeout=SAFETY)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert len({r["message"] for r in results}) == 1  # every rank says the same


DEATH_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import procgroup as pg

    victim, how = int(sys.argv[1]), sys.argv[2]
    pg.init_process_group("mpi", timeout=600)
    x = np.ones(4)
    for step in range(10**6):  # the survivors would wait for the victim for 600 s
        pg.all_reduce(x)
        if step == 20 and pg.get_rank() == victim:
            print("dying", flush=True)
            time.sleep(0.2)
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
    print("finished", pg.get_rank(), flush=True)
""")


@pytest.mark.parametrize(("victim", "how"), [(2, "exit"), (2, "kill"), (0, "kill")])
def test_a_death_ends_the_whole_job_promptly(tmp_path: Path, victim: int, how: str) -> None:
    script = tmp_path / "dies.py"
    script.write_text(DEATH_SCRIPT)
    env = {**os.environ, "PROCGROUP_MPI_ABORT_ON_EXCEPTION": "0"}  # only the death ends the job
    proc = subprocess.run(mpiexec_command() + ["-n", "4", sys.executable, str(script), str(victim), how],
                          check=False, capture_output=True, text=True, timeout=SAFETY, stdin=subprocess.DEVNULL,
                          env=env)
    assert "dying" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "finished" not in proc.stdout  # no survivor went on: mpiexec ended them


def test_keep_going_is_refused_with_backend_mpi(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="--keep-going does not work with --backend mpi"):
        LaunchOptions(target="x.py", keep_going=True, mpiexec="/usr/bin/mpiexec").validate()
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('a rank was started')\n")
    proc = subprocess.run([sys.executable, "-m", "procgroup.run", "--backend", "mpi", "--keep-going",
                           "--nproc-per-node", "2", str(script)],
                          check=False, capture_output=True, text=True, timeout=SAFETY, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert "--keep-going does not work with --backend mpi" in proc.stderr, proc.stderr
    assert "ULFM" in proc.stderr and "--backend tcp" in proc.stderr, proc.stderr
    assert "a rank was started" not in proc.stdout + proc.stderr
