"""A rank as the launcher sees it: its process, files and how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

from procgroup._launch import rankside
from procgroup._launch.options import LaunchOptions
from procgroup._launch.output import LockedStream, Pump, Tail


def describe_returncode(returncode: int) -> str:
    """'exited with code 3' or 'was killed by SIGKILL' (Popen reports signals as -N)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name}"


def exit_code_for(returncode: int) -> int:
    """The launcher's exit code for a rank's: the same code, or 128+N for signal N (as shells)."""
    return returncode if returncode > 0 else 128 + (-returncode)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (ranks under mpiexec are not ours
    to wait for; their parent, mpiexec's proxy, reaps them)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


@dataclass
class Rank:
    local_rank: int
    rank: int
    node_rank: int
    proc: subprocess.Popen[bytes] | None  # None under mpiexec: started by it, not by us
    error_file: str
    status_file: str
    tail: Tail = field(default_factory=Tail)
    pumps: list[Pump] = field(default_factory=list)
    pid: int | None = None
    returncode: int | None = None
    how: str | None = None  # how it ended when no exit code is known (under mpiexec)
    stopped: bool = False  # the launcher signalled it
    detected: float = 0.0  # wall-clock time the launcher saw it exit

    def label(self) -> str:
        pid = self.pid if self.pid is not None else "?"
        return f"rank {self.rank} (node {self.node_rank}, local rank {self.local_rank}, pid {pid})"

    def describe(self) -> str:
        if self.how is not None:
            return self.how
        return describe_returncode(self.returncode if self.returncode is not None else 0)

    def status(self) -> dict[str, Any]:
        return rankside.read_status(self.status_file) or {}

    def recorded_exit(self) -> int | None:
        """The exit code the rank recorded when it raised SystemExit / ended its script."""
        code = self.status().get("exitcode")
        return code if isinstance(code, int) else None


class NodeJob:
    """What the Supervisor's parts (spawn, watch, report) share: the options, the ranks,
    mpiexec, the output streams. The Supervisor sets them; the parts only declare them."""

    opts: LaunchOptions
    _out: LockedStream
    _err: LockedStream
    _ranks: list[Rank]
    _mpiexec: subprocess.Popen[bytes] | None
    _mpiexec_tail: Tail
    _mpiexec_pumps: list[Pump]
    _fifos: list[str]
    _token: str | None
    _escalate: bool
    _signal: int | None
    _flight_dir: str | None  # this attempt's flight dumps (launch.flight)
    _report_asked: bool  # the report signal arrived: print a live report

    def _live_report(self) -> None:
        """Print the flight recorder's report now, the job going on (Reporting has it)."""

    def _say(self, message: str) -> None:
        """A launcher message on stderr, each line marked as the launcher's."""
        text = "".join(f"procgroup-run: {line}\n" for line in message.splitlines())
        self._err.write(text.encode("utf-8", "replace"))


__all__ = ["NodeJob", "Rank", "describe_returncode", "exit_code_for", "pid_alive"]
