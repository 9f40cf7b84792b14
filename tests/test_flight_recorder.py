"""The flight recorder's ring, read from Python in a real group, and the offline analyser.

One job of three tcp ranks (tcp:// rendezvous, so each rank's Store responder runs) checks
many things: the entries of collectives and point-to-point calls (numbers per group, peer,
size, dtype, state; the caller's own file and line for an op that waited, none for one that
completed without waiting), a sub-group's own numbering, the ring's
bound, the JSON dump, and a live report gathered through the Store. The analyser's rules
are checked in process on dumps the ranks wrote.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)
RING = 40


def _line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (what the record must name as the caller)."""
    for i, line in enumerate(inspect.getsource(sys.modules[__name__]).splitlines(), 1):
        if marker in line and "_line_of" not in line:
            return i
    raise AssertionError(marker)


def _caller(e: dict[str, Any], marker: str) -> bool:
    """Whether entry ``e`` names the line of ``marker`` in recorder_checks as its caller, or
    (an op that completed without waiting: the recorder does not look its caller up) none."""
    if e["file"] is None:
        return e["line"] is None and e["function"] is None and e["caller"].startswith("omitted")
    return (os.path.basename(e["file"]), e["function"], e["line"]) == (
        "test_flight_recorder.py", "recorder_checks", _line_of(marker))


def recorder_checks(rank: int, size: int, out_dir: str) -> dict[str, Any]:
    import procgroup as dist

    x = np.arange(4, dtype=np.float32)
    dist.all_reduce(x)  # MARK-all-reduce
    dist.broadcast(x, src=1)  # MARK-broadcast
    if rank == 0:
        time.sleep(0.2)  # rank 2's first receive waits: a slow op, which names its caller
        dist.send(np.ones(3, dtype=np.int64), dst=2)  # MARK-send
        dist.send(np.ones(3, dtype=np.int64), dst=2)  # MARK-fast-send
    elif rank == 2:
        dist.recv(np.empty(3, dtype=np.int64), src=0)  # MARK-recv
        dist.recv(np.empty(3, dtype=np.int64), src=0)  # MARK-fast-recv
    sub = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.all_reduce(np.ones(2, dtype=np.float64), group=sub)  # MARK-sub
    dist.barrier()
    record = dist.flight_record()
    for _ in range(RING + 5):  # the ring keeps the newest RING entries only
        dist.all_reduce(np.zeros(1, dtype=np.float32))  # MARK-loop
    bounded = dist.flight_record()
    text = dist.dump_flight_record(os.path.join(out_dir, f"rank{rank}.flight.json"))
    report = dist.flight_report()
    dist.barrier()
    return {"record": record, "bounded": bounded, "dump": json.loads(text), "report": report}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("flight")
    results = spawn(recorder_checks, 3, "tcp", init_method="tcp", args=(str(out),),
                    env={"PROCGROUP_FLIGHT_RECORDER": str(RING)})
    return results, out


def _world(record: list[dict[str, Any]], op: str) -> list[dict[str, Any]]:
    return [e for e in record if e["op"] == op and e["group_id"] == 0]


def test_collectives_are_numbered_per_group_with_their_caller(job: tuple[list[dict[str, Any]], Path]) -> None:
    results, _ = job
    for rank, res in enumerate(results):
        rec = res["record"]
        ar, = _world(rec, "all_reduce")
        bc, = _world(rec, "broadcast")
        barrier, = _world(rec, "barrier")
        assert (ar["seq"], bc["seq"], barrier["seq"]) == (1, 2, 3)  # one numbering per group, from 1
        assert ar["kind"] == "collective" and ar["state"] == "done" and ar["start"] > 0
        assert ar["bytes"] == 16 and ar["dtype"] == "float32" and ar["peer"] is None
        assert bc["peer"] == 1  # the root, as a world rank
        assert _caller(ar, "# MARK-all-reduce") and _caller(bc, "# MARK-broadcast")
        assert ar["group_ranks"] == [0, 1, 2]
        subs = [e for e in rec if e["group_id"] != 0 and e["kind"] == "collective"]
        if rank in (0, 1):
            sub, = subs
            assert (sub["op"], sub["seq"], sub["group_ranks"], sub["bytes"], sub["dtype"]) == (
                "all_reduce", 1, [0, 1], 16, "float64")
            assert _caller(sub, "# MARK-sub")
        else:
            assert subs == []
        # the steps inside a collective are not recorded: only what the caller started
        assert all(e["kind"] == "collective" or e["op"] in ("send", "recv") for e in rec)


def test_point_to_point_entries_name_the_peer(job: tuple[list[dict[str, Any]], Path]) -> None:
    results, _ = job
    # the first call of a dtype takes the checked path, the second the fast path; rank 2's
    # first receive waited (rank 0 sent 0.2 s late), so it names its caller's line
    sent, sent_again = [e for e in results[0]["record"] if e["kind"] == "p2p"]
    got, got_again = [e for e in results[2]["record"] if e["kind"] == "p2p"]
    assert (sent["op"], sent["peer"], sent["bytes"], sent["dtype"], sent["seq"]) == ("send", 2, 24, "int64", 1)
    assert (got["op"], got["peer"], got["state"]) == ("recv", 0, "done")
    assert got["line"] == _line_of("# MARK-recv") and got["function"] == "recorder_checks"
    assert _caller(sent, "# MARK-send")
    assert (sent_again["seq"], sent_again["peer"], got_again["seq"], got_again["peer"]) == (2, 2, 2, 0)
    assert _caller(sent_again, "# MARK-fast-send") and _caller(got_again, "# MARK-fast-recv")
    assert not [e for e in results[1]["record"] if e["kind"] == "p2p"]


def test_the_ring_is_bounded(job: tuple[list[dict[str, Any]], Path]) -> None:
    results, _ = job
    for res in results:
        bounded = res["bounded"]
        assert len(bounded) == RING
        seqs = [e["seq"] for e in bounded if e["group_id"] == 0 and e["op"] == "all_reduce"]
        assert seqs == sorted(seqs) and seqs[-1] == 3 + RING + 5  # the newest kept, in order
        # the loop's all_reduces take the fast path: those that waited name the loop's line,
        # the others no caller
        loop = [e for e in bounded if e["group_id"] == 0 and e["op"] == "all_reduce"]
        assert all(_caller(e, "# MARK-loop") and e["state"] == "done" for e in loop)
        assert res["dump"]["ring_size"] == RING


def test_the_dump_holds_stacks_and_the_report_sees_every_rank(job: tuple[list[dict[str, Any]], Path]) -> None:
    results, _ = job
    for rank, res in enumerate(results):
        dump = res["dump"]
        assert dump["rank"] == rank and dump["pid"] > 0
        main, = [t for t in dump["stacks"] if t["main"]]
        assert any(f["function"] == "recorder_checks" for f in main["frames"])
        # every rank answered (a rank may already wait in the barrier that follows)
        assert all(f"rank {r}: " in res["report"] for r in range(3))
        assert "gave no record" not in res["report"]


def test_python_m_procgroup_flight_reads_saved_dumps(job: tuple[list[dict[str, Any]], Path]) -> None:
    _, out = job
    res = subprocess.run([sys.executable, "-m", "procgroup", "flight", str(out)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "3 dump(s), ranks [0, 1, 2]" in res.stdout
    bad = out / "not-a-dump.json"
    bad.write_text("[1, 2]")
    res = subprocess.run([sys.executable, "-m", "procgroup", "flight", str(bad)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 2 and "not a procgroup flight dump" in res.stderr


def test_faulthandler_text_is_read_as_stacks(tmp_path: Path) -> None:
    """A rank stuck in C leaves only faulthandler's text: the launcher reads it as stacks
    (innermost frame last, the main thread last in the dump)."""
    from procgroup._launch.flight import parse_faulthandler

    script = tmp_path / "stuck.py"
    script.write_text(
        "import faulthandler, sys, threading, time\n"
        "def side():\n"
        "    time.sleep(5)\n"
        "threading.Thread(target=side, daemon=True).start()\n"
        "def load_batch():\n"
        "    faulthandler.dump_traceback(sys.stdout, all_threads=True)\n"
        "load_batch()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    stacks = parse_faulthandler(out.stdout)
    assert len(stacks) == 2
    main = stacks[-1]
    assert main["main"] and [f["function"] for f in main["frames"]] == ["<module>", "load_batch"]
    assert main["frames"][-1]["line"] == 6 and main["frames"][-1]["file"] == str(script)
    assert stacks[0]["frames"][-1]["function"] == "side"
