"""Run the job of one node: start, watch and stop its ranks, restarts, timeout, summary.

The concerns live in their own modules, joined here: spawn (the ranks' processes,
environment and files), watch (reaping, the failure policy, signals and the grace
period), report (the failure summary and the culprit report), ranks (one rank's record).

Why each rank gets its own session (process group): the launcher can then signal a rank
together with any processes it started, and a Ctrl-C in the terminal reaches only the
launcher, which forwards it to every rank in one place (and escalates to SIGKILL after
``--grace-period``, or at once on a second Ctrl-C).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType
from typing import BinaryIO, cast

from procgroup._launch.options import STDERR, STDOUT, LaunchOptions
from procgroup._launch.output import LockedStream, Pump, Tail
from procgroup._launch.ports import PortReservation
from procgroup._launch.ranks import Rank, describe_returncode, exit_code_for, pid_alive
from procgroup._launch.report import Reporting
from procgroup._launch.spawn import Spawning
from procgroup._launch.watch import Watching

logger = logging.getLogger(__name__)

EXIT_TIMEOUT = 124  # like coreutils timeout(1)
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: the signal that asks procgroup-run for a live culprit report (the job goes on)
REPORT_SIGNAL = signal.SIGUSR1


class Supervisor(Spawning, Watching, Reporting):
    """Runs the job of one node; :meth:`run` returns the launcher's exit code."""

    def __init__(
        self, opts: LaunchOptions, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None
    ) -> None:
        self.opts = opts
        self._out = LockedStream(stdout if stdout is not None else sys.stdout.buffer)
        self._err = LockedStream(stderr if stderr is not None else sys.stderr.buffer)
        self._signal: int | None = None
        self._escalate = False
        self._flight_dir: str | None = None
        self._report_asked = False
        self._ranks: list[Rank] = []
        self._mpiexec: subprocess.Popen[bytes] | None = None  # --backend mpi: one for all ranks
        self._mpiexec_tail = Tail()
        self._mpiexec_pumps: list[Pump] = []
        self._fifos: list[str] = []
        self._token = self._job_token()

    # ----- signals ------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is not None:
            self._escalate = True  # second Ctrl-C: no more grace
        else:
            self._signal = signum

    def _on_report_signal(self, signum: int, frame: FrameType | None) -> None:
        self._report_asked = True  # the watch loop prints it: no work in a signal handler

    def _install_signal_handlers(self) -> dict[int, object]:
        previous: dict[int, object] = {}
        for sig in _HANDLED_SIGNALS:
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller handles signals
                return previous
        try:
            previous[REPORT_SIGNAL] = signal.signal(REPORT_SIGNAL, self._on_report_signal)
        except ValueError:
            pass
        return previous

    # ----- the job ------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job (with restarts); return the launcher's exit code."""
        o = self.opts
        reservation = PortReservation() if o.master_port is None else None
        port = reservation.port if reservation is not None else int(o.master_port or 0)
        run_dir = tempfile.mkdtemp(prefix="procgroup-run-")  # status files, named pipes
        keep_logs = o.log_dir is not None or any(o.logged(r, b) for r in range(o.nproc_per_node)
                                                 for b in (STDOUT, STDERR))
        if o.log_dir is not None:
            os.makedirs(o.log_dir, exist_ok=True)
            files_dir = o.log_dir
        elif keep_logs:  # --redirects/--tee without --log-dir: a kept directory, as torchrun
            files_dir = tempfile.mkdtemp(prefix="procgroup-run-logs-")
            self._say(f"log files in {files_dir} (no --log-dir given)")
        else:
            files_dir = run_dir
        previous = self._install_signal_handlers()
        deadline = time.monotonic() + o.timeout if o.timeout is not None else None
        try:
            logger.info(
                "node %d/%d: starting %d ranks%s, world size %d, master %s:%d",
                o.node_rank, o.nnodes, o.nproc_per_node,
                f" through {o.mpiexec}" if o.mpiexec else "", o.world_size, o.master_addr, port,
            )
            restart = 0
            while True:
                self._start(port, restart, files_dir, run_dir)
                outcome = self._watch(deadline)
                if outcome == "success":
                    if self._mpiexec is not None:
                        self._mpiexec.wait(timeout=30)
                    self._drain()
                    return 0
                if outcome == "signal":
                    sig = int(self._signal or signal.SIGTERM)
                    name = signal.Signals(sig).name
                    self._say(f"received {name}: stopping all ranks")
                    report = self._flight_report()
                    if report is not None and (report.reasons or report.cycles):
                        self._say("flight recorder report (before the stop):\n" + report.text())
                    self._stop_all(sig if sig == signal.SIGINT else signal.SIGTERM)
                    return 128 + sig
                if outcome == "timeout":
                    alive = [r.rank for r in self._ranks if r.returncode is None]
                    report = self._flight_report()  # before the stop: where each rank is
                    self._stop_all()
                    self._summary(
                        f"job timed out after {o.timeout:g} s (--timeout); "
                        f"ranks still running were stopped: {alive}",
                        None, report,
                    )
                    return EXIT_TIMEOUT
                report = self._flight_report()  # before the stop: where each rank is
                self._stop_all()  # first: the rank that raised may still be tearing down
                root = self._root_cause()
                attempts = f"attempt {restart + 1} of {o.max_restarts + 1}"
                if o.keep_going:
                    failed = [r.rank for r in self._ranks if r.returncode not in (None, 0)]
                    attempts = f"--keep-going: the others ran on; failed ranks: {failed}"
                self._summary(f"job failed ({attempts})", root, report)
                if restart >= o.max_restarts:
                    if root is None:
                        return exit_code_for(cast(subprocess.Popen, self._mpiexec).returncode or 1)
                    return exit_code_for(root.returncode or 1)
                restart += 1
                if self._signal is not None:
                    return 128 + self._signal
                self._say(f"restarting all local ranks (restart {restart} of {o.max_restarts})")
        finally:
            for r in self._ranks:  # only after an error in the launcher itself
                if r.proc is not None and r.returncode is None and r.proc.poll() is None:
                    self._signal_group(r, signal.SIGKILL)
                    try:
                        r.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        logger.warning("%s did not die after SIGKILL", r.label())
                elif r.proc is None and r.pid is not None and pid_alive(r.pid):
                    self._signal_group(r, signal.SIGKILL)
            if self._mpiexec is not None and self._mpiexec.poll() is None:
                self._signal_mpiexec(signal.SIGKILL)
                try:
                    self._mpiexec.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    logger.warning("mpiexec did not die after SIGKILL")
            for sig, handler in previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]  # getsignal's result, None included, goes back as it was
            if reservation is not None:
                reservation.close()
            shutil.rmtree(run_dir, ignore_errors=True)


__all__ = ["EXIT_TIMEOUT", "Supervisor", "describe_returncode", "exit_code_for", "pid_alive"]
