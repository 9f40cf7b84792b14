"""The launcher's failure summary: which rank is the root cause, its traceback and output,
and how every other rank ended."""

from __future__ import annotations

import logging
import math
from typing import cast

from procgroup._flight_analysis import Report
from procgroup._launch import flight, rankside
from procgroup._launch.ranks import NodeJob, Rank, describe_returncode


logger = logging.getLogger(__name__)


class Reporting(NodeJob):
    """The Supervisor's part that explains a failed job (a mixin)."""

    # ----- the flight recorder's report ----------------------------------------------------

    def _flight_report(self) -> Report | None:
        """The culprit report from the local ranks' flight dumps (running ranks are asked
        by signal first); None when ranks cannot be asked (--no-python)."""
        if self._flight_dir is None or self.opts.no_python:
            return None
        try:
            return flight.collect(self._ranks, self._flight_dir, self.opts.world_size)
        except Exception:
            logger.warning("could not build the flight recorder report", exc_info=True)
            return None

    def _live_report(self) -> None:
        """The report asked for by the report signal, the job going on."""
        report = self._flight_report()
        if report is not None:
            self._say("flight recorder report (the job goes on):\n" + report.text())

    # ----- reporting ----------------------------------------------------------------------

    def _failure_time(self, r: Rank) -> tuple[int, float, int]:
        """Sort key of the root cause: (consequence?, earliest evidence of failure, rank).

        Evidence: the time it recorded a non-zero exit (sys.exit, before its teardown told
        its peers) or its exception, else when it was seen dead on its own; a rank the
        launcher stopped without a record is never the cause. A rank that failed with a
        PeerError only reacted to another rank's failure, so it comes after any other.
        """
        times = []
        rec = rankside.read_error_file(r.error_file)
        if rec and isinstance(rec.get("time"), (int, float)):
            times.append(float(rec["time"]))
        st = r.status()
        if st.get("exitcode") not in (None, 0) and isinstance(st.get("time"), (int, float)):
            times.append(float(st["time"]))
        if not r.stopped:
            times.append(r.detected)
        consequence = int(rec is not None and rec.get("exc_type") == "PeerError")
        return (consequence, min(times) if times else math.inf, r.rank)

    def _root_cause(self) -> Rank | None:
        # a rank the launcher stopped can still be the cause: it may have raised first and
        # been tearing down while the peers it left behind failed and exited before it
        failed = [r for r in self._ranks if r.returncode not in (None, 0)]
        if not failed:
            return None  # mpiexec itself failed
        root = min(failed, key=self._failure_time)
        recorded = root.recorded_exit()
        if root.stopped and recorded:
            # it died of its own exit code / exception; our SIGTERM only cut its teardown
            # short, after its peers had already noticed and failed
            root.returncode, root.how = recorded, None
        elif root.stopped and rankside.read_error_file(root.error_file):
            root.returncode, root.how = 1, None
        return root

    def _summary(self, headline: str, root: Rank | None, report: Report | None = None) -> None:
        lines = [headline]
        if report is not None and report.reasons and report.stuck:
            # the rank that holds the job up, not the first to give up waiting on it
            lines.append(f"root cause: {report.reasons[0]}")
            lines.extend(f"also: {why}" for why in report.reasons[1:])
            lines.extend(f"wait-for cycle: {c}" for c in report.cycles)
            if root is not None and root.returncode is not None:
                lines.append(f"first rank to exit: {root.label()} {root.describe()}")
        elif report is not None and report.cycles:
            lines.extend(f"root cause: wait-for cycle: {c}" for c in report.cycles)
        elif root is not None and root.returncode is not None:
            lines.append(f"root cause: {root.label()} {root.describe()}")
        elif self._mpiexec is not None and self._mpiexec.returncode not in (None, 0):
            lines.append(f"root cause: mpiexec (pid {self._mpiexec.pid}) "
                         f"{describe_returncode(cast(int, self._mpiexec.returncode))}")
        self._say("\n".join(lines))
        if root is not None:
            rec = rankside.read_error_file(root.error_file)
            if rec and rec.get("traceback"):
                tb = str(rec["traceback"])
                self._say(f"uncaught exception on rank {root.rank}:")
                prefix = f"[rank{root.rank}]: "
                text = "".join(prefix + line + "\n" for line in tb.rstrip("\n").splitlines())
                self._err.write(text.encode("utf-8", "replace"))
            tail = root.tail.lines()
            if tail:
                self._say(f"last {len(tail)} lines of rank {root.rank}'s output:\n"
                          + "\n".join(f"  | {line}" for line in tail))
        mpi_tail = self._mpiexec_tail.lines() if self._mpiexec is not None else []
        if mpi_tail and (root is None or root.how is not None):
            self._say("last lines of mpiexec's output:\n" + "\n".join(f"  | {line}" for line in mpi_tail))
        others = []
        for r in self._ranks:
            if r is root or r.returncode is None:
                continue
            how = r.describe()
            if r.stopped:
                how += " (stopped by the launcher)"
            rec = rankside.read_error_file(r.error_file)
            if rec:
                how += f" after {rec.get('exc_type')}: {str(rec.get('message', '')).splitlines()[0] if rec.get('message') else ''}"
            others.append(f"  {r.label()} {how}")
        if others:
            self._say("other ranks:\n" + "\n".join(others))
        if report is not None and (report.reasons or report.cycles):
            self._say("flight recorder report:\n" + report.text())


__all__ = ["Reporting"]
