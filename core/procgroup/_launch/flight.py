"""The launcher's side of the flight recorder: ask the local ranks for their dumps (a
signal), collect them from the flight directory, and analyse them into the culprit
report (procgroup._flight_analysis; docs/debugging.md).

Why a signal and files rather than the job's sockets: the report is wanted exactly when
the data channel is stuck, and the launcher holds no connection to it. Each rank's
bootstrap (rankside.install_flight_dump) writes ``rankN.flight.json`` when signalled;
a rank whose op failed writes it too before it exits (procgroup.backend._recorder), so
ranks that are gone still count with what they last did. A rank that cannot run Python
(stuck in C) leaves at least faulthandler's text in ``rankN.stacks.txt``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from procgroup._flight_analysis import Report, analyse
from procgroup._launch import rankside
from procgroup._launch.ranks import Rank

logger = logging.getLogger(__name__)

#: how long the launcher waits for the signalled ranks' dumps
DUMP_WAIT_S = 3.0

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')


def parse_faulthandler(text: str) -> list[dict[str, Any]]:
    """faulthandler's all-threads dump as stacks (innermost frame last). Threads are listed
    newest first, so the main thread is the last one."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            threads.append({"thread": line.split(" (")[0], "main": False, "frames": []})
        elif threads:
            m = _FRAME.match(line)
            if m:
                threads[-1]["frames"].insert(0, {"file": m["file"], "line": int(m["line"]),
                                                 "function": m["function"], "code": ""})
    if threads:
        threads[-1]["main"] = True
    return threads


def collect(ranks: list[Rank], directory: str, rank_count: int, local: bool = True) -> Report:
    """Signal the running ranks, wait for their dumps, and analyse what there is."""
    sig = rankside.flight_signal()
    asked: dict[int, tuple[int, int]] = {}  # rank -> (signal time ns, stacks file size then)
    for r in ranks:
        if r.returncode is not None or r.pid is None or r.status().get("exitcode") is not None:
            continue  # gone, or tearing down: its dump (if it failed in an op) is written
        _, text_path = rankside.flight_files(directory, str(r.rank))
        try:
            size = os.path.getsize(text_path)
        except OSError:
            size = 0
        try:
            os.kill(r.pid, sig)  # the rank alone, not its process group
        except (ProcessLookupError, PermissionError):
            continue
        asked[r.rank] = (time.time_ns(), size)
    deadline = time.monotonic() + DUMP_WAIT_S
    pending = set(asked)
    while pending and time.monotonic() < deadline:
        for rank in list(pending):
            json_path, _ = rankside.flight_files(directory, str(rank))
            try:
                if os.stat(json_path).st_mtime_ns >= asked[rank][0] - 5_000_000:
                    pending.discard(rank)
            except OSError:
                pass
        if pending:
            time.sleep(0.05)
    dumps = []
    absent: dict[int, str] = {}
    for r in ranks:
        json_path, text_path = rankside.flight_files(directory, str(r.rank))
        data = rankside.read_json(json_path)
        if data is None and r.rank in pending:
            data = _from_faulthandler(r.rank, text_path, asked[r.rank][1])
        if data is not None:
            dumps.append(data)
        elif r.returncode is not None:
            absent[r.rank] = r.describe()
        else:
            absent[r.rank] = "did not answer the dump signal"
    if local:
        mine = {r.rank for r in ranks}
        for other in range(rank_count):
            if other not in mine:
                absent.setdefault(other, "runs on another node (its procgroup-run reports it)")
    return analyse(dumps, world_size=rank_count, absent=absent)


def _from_faulthandler(rank: int, path: str, offset: int) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            text = f.read()
    except OSError:
        return None
    stacks = parse_faulthandler(text)
    if not stacks:
        return None
    return {"format": "procgroup-flight-1", "rank": rank, "time": time.time(), "ops": [], "stacks": stacks,
            "note": "no flight record: the rank did not run Python after the signal (stuck in C code?)"}


__all__ = ["DUMP_WAIT_S", "collect", "parse_faulthandler"]
