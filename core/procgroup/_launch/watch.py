"""Watching the ranks of one node and stopping them: reaping, the failure policy
(stop all at the first failure, or ``--keep-going``), signals, the grace period."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

from procgroup._launch import rankside
from procgroup._launch.ranks import NodeJob, Rank, pid_alive

logger = logging.getLogger(__name__)


class Watching(NodeJob):
    """The Supervisor's part that watches and stops ranks (a mixin)."""

    # ----- watching and stopping ----------------------------------------------------------

    def _poll(self) -> list[Rank]:
        """Reap ranks that exited since the last poll; return them."""
        now = time.time()  # wall clock: compared with the error files' timestamps
        done = []
        mpiexec_done = self._mpiexec is not None and self._mpiexec.poll() is not None
        for r in self._ranks:
            if r.returncode is not None:
                continue
            if r.proc is not None:
                rc = r.proc.poll()
                if rc is not None:
                    r.returncode, r.detected = rc, now
                    done.append(r)
                continue
            # under mpiexec: what the rank recorded, and whether its pid is still there
            st = r.status()
            if r.pid is None and isinstance(st.get("pid"), int):
                r.pid = st["pid"]
            code = st.get("exitcode")
            alive = r.pid is not None and pid_alive(r.pid)
            if isinstance(code, int) and (code != 0 or not alive or mpiexec_done):
                r.returncode, r.detected = code, now  # a failure counts at once
            elif (r.pid is not None and not alive) or mpiexec_done:
                r.detected = now
                if rankside.read_error_file(r.error_file):
                    r.returncode = 1
                elif r.pid is None:
                    r.returncode, r.how = 1, "never started (see mpiexec's output below)"
                else:
                    r.returncode = 1
                    r.how = "ended without an exit status (killed by a signal, or os._exit)"
            if r.returncode is not None:
                done.append(r)
        return done

    def _watch(self, deadline: float | None) -> str:
        """Block until 'success', 'failure', 'timeout' or 'signal'. With --keep-going a
        failed rank is reported and the others run on; 'failure' once all have ended."""
        while True:
            done = self._poll()
            if self._signal is not None:
                return "signal"
            if self._report_asked:
                self._report_asked = False
                self._live_report()
            if self.opts.keep_going:
                for r in done:
                    if r.returncode not in (None, 0):
                        self._say(f"{r.label()} {r.describe()}; the other ranks go on (--keep-going)")
                if all(r.returncode is not None for r in self._ranks) and any(
                        r.returncode != 0 for r in self._ranks):
                    return "failure"
            elif any(r.returncode not in (None, 0) for r in self._ranks):
                return "failure"
            if all(r.returncode == 0 for r in self._ranks):
                if self._mpiexec is None:
                    return "success"
                rc = self._mpiexec.poll()
                if rc is not None:
                    return "success" if rc == 0 else "failure"
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            time.sleep(self.opts.monitor_interval)

    def _signal_group(self, r: Rank, sig: int) -> None:
        if r.pid is None:
            return
        try:
            os.killpg(r.pid, sig)  # the rank leads its own session: pgid == pid
        except ProcessLookupError:
            if r.proc is None:  # under mpiexec: not necessarily a group leader
                try:
                    os.kill(r.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        except PermissionError:
            pass

    def _signal_mpiexec(self, sig: int) -> None:
        if self._mpiexec is not None and self._mpiexec.poll() is None:
            try:
                os.killpg(self._mpiexec.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _stop_all(self, first_signal: int = signal.SIGTERM) -> None:
        """Signal every running rank, SIGKILL what is left after the grace period, reap all."""
        self._poll()
        running = [r for r in self._ranks if r.returncode is None or self._lingers(r)]
        for r in running:
            r.stopped = r.returncode is None
            self._signal_group(r, first_signal)
        self._signal_mpiexec(first_signal)
        grace_end = time.monotonic() + self.opts.grace_period
        while running and time.monotonic() < grace_end and not self._escalate:
            time.sleep(self.opts.monitor_interval)
            self._poll()
            running = [r for r in running if r.returncode is None or self._lingers(r)]
        for r in running:
            logger.debug("%s still running after the grace period: SIGKILL", r.label())
            self._signal_group(r, signal.SIGKILL)
        for r in running:
            if r.proc is not None:
                try:
                    r.returncode = r.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:  # unkillable (D state): report, don't hang
                    self._say(f"{r.label()} did not die after SIGKILL; leaving it")
        if self._mpiexec is not None:
            try:
                self._mpiexec.wait(timeout=self.opts.grace_period + 1)
            except subprocess.TimeoutExpired:
                self._signal_mpiexec(signal.SIGKILL)
                try:
                    self._mpiexec.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._say(f"mpiexec (pid {self._mpiexec.pid}) did not die after SIGKILL")
            self._poll()  # ranks that never recorded anything end with mpiexec
        self._drain()

    def _lingers(self, r: Rank) -> bool:
        """A rank under mpiexec that recorded its failure but whose process is still there
        (e.g. tearing down, or stuck in MPI_Finalize)."""
        return r.proc is None and r.pid is not None and pid_alive(r.pid)

    def _drain(self) -> None:
        """Let the pumps copy what the ranks wrote last (bounded: a grandchild may hold a pipe)."""
        for path in self._fifos:  # a pump still waiting for a rank that never opened its pipe
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        for p in [*(p for r in self._ranks for p in r.pumps), *self._mpiexec_pumps]:
            p.join(timeout=2.0)


__all__ = ["Watching"]
