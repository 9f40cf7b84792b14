"""Start, watch and stop the local ranks of one node; restarts, timeout, failure summary.

Why each rank gets its own session (process group): the launcher can then signal a rank
together with any processes it started, and a Ctrl-C in the terminal reaches only the
launcher, which forwards it to every rank in one place (and escalates to SIGKILL after
``--grace-period``, or at once on a second Ctrl-C).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import BinaryIO, cast

from procgroup._auth import ENV_TOKEN, new_token
from procgroup._launch import rankside
from procgroup._launch.options import LaunchOptions
from procgroup._launch.output import LockedStream, Pump
from procgroup._launch.ports import PortReservation

logger = logging.getLogger(__name__)

EXIT_TIMEOUT = 124  # like coreutils timeout(1)
_POLL = 0.05
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


@dataclass
class _Rank:
    local_rank: int
    rank: int
    node_rank: int
    proc: subprocess.Popen[bytes]
    error_file: str
    pumps: list[Pump] = field(default_factory=list)
    returncode: int | None = None
    stopped: bool = False  # the launcher signalled it
    detected: float = 0.0  # wall-clock time the launcher saw it exit

    def label(self) -> str:
        return f"rank {self.rank} (node {self.node_rank}, local rank {self.local_rank}, pid {self.proc.pid})"


class Supervisor:
    """Runs the job of one node; :meth:`run` returns the launcher's exit code."""

    def __init__(
        self, opts: LaunchOptions, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None
    ) -> None:
        self.opts = opts
        self._out = LockedStream(stdout if stdout is not None else sys.stdout.buffer)
        self._err = LockedStream(stderr if stderr is not None else sys.stderr.buffer)
        self._signal: int | None = None
        self._escalate = False
        self._ranks: list[_Rank] = []
        self._token = self._job_token()

    # ----- messages -----------------------------------------------------------------------

    def _say(self, message: str) -> None:
        """A launcher message on stderr, each line marked as the launcher's."""
        text = "".join(f"procgroup-run: {line}\n" for line in message.splitlines())
        self._err.write(text.encode("utf-8", "replace"))

    # ----- signals ------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is not None:
            self._escalate = True  # second Ctrl-C: no more grace
        else:
            self._signal = signum

    def _install_signal_handlers(self) -> dict[int, object]:
        previous: dict[int, object] = {}
        for sig in _HANDLED_SIGNALS:
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread: the caller handles signals
                break
        return previous

    # ----- the job token --------------------------------------------------------------------

    def _job_token(self) -> str | None:
        """The token the ranks share: $PROCGROUP_JOB_TOKEN when set; else a fresh one for a
        single-node job (every rank is started here); a multi-node job needs one given."""
        o = self.opts
        given = o.extra_env.get(ENV_TOKEN) or os.environ.get(ENV_TOKEN)
        if given:
            return None  # inherited by the ranks as it is
        if o.nnodes == 1:
            return new_token()
        self._say(
            f"warning: no job token for this {o.nnodes}-node job: anyone who reaches "
            f"{o.master_addr}:{o.master_port} can join it. Set the same secret in {ENV_TOKEN} "
            f"for procgroup-run on every node (e.g. {ENV_TOKEN}=$(python -c 'import secrets; "
            f"print(secrets.token_hex(24))'))"
        )
        return None

    # ----- starting -----------------------------------------------------------------------

    def _rank_env(self, local_rank: int, port: int, restart: int, error_file: str) -> dict[str, str]:
        o = self.opts
        env = dict(os.environ)
        env.update(o.extra_env)
        env.update(
            RANK=str(o.global_rank(local_rank)),
            WORLD_SIZE=str(o.world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(o.nproc_per_node),
            GROUP_RANK=str(o.node_rank),
            MASTER_ADDR=o.master_addr,
            MASTER_PORT=str(port),
            PROCGROUP_RESTART_COUNT=str(restart),
            PROCGROUP_ERROR_FILE=error_file,
            PROCGROUP_LAUNCHER_PID=str(os.getpid()),
            PYTHONUNBUFFERED="1",
        )
        if self._token is not None:
            env[ENV_TOKEN] = self._token
        if o.backend is not None:
            env["PROCGROUP_BACKEND"] = o.backend
        if o.nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"  # n ranks x all cores of BLAS threads would thrash
        return env

    def _command(self) -> list[str]:
        boot = os.path.abspath(rankside.__file__)
        if self.opts.module:
            return [sys.executable, "-u", boot, "-m", self.opts.target, *self.opts.target_args]
        return [sys.executable, "-u", boot, self.opts.target, *self.opts.target_args]

    def _file_names(self, files_dir: str, rank: int, restart: int) -> tuple[str, str, str]:
        stem = f"rank{rank}" if restart == 0 else f"rank{rank}.restart{restart}"
        return (
            os.path.join(files_dir, f"{stem}.stdout.log"),
            os.path.join(files_dir, f"{stem}.stderr.log"),
            os.path.join(files_dir, f"{stem}.error.json"),
        )

    def _start(self, port: int, restart: int, files_dir: str) -> None:
        o = self.opts
        cmd = self._command()
        self._ranks = []
        for local_rank in range(o.nproc_per_node):
            rank = o.global_rank(local_rank)
            out_log, err_log, error_file = self._file_names(files_dir, rank, restart)
            if os.path.exists(error_file):
                os.unlink(error_file)
            proc = subprocess.Popen(
                cmd,
                env=self._rank_env(local_rank, port, restart, error_file),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            r = _Rank(local_rank, rank, o.node_rank, proc, error_file)
            prefix = f"[rank{rank}]: ".encode() if o.prefix else b""
            stdout, stderr = cast(BinaryIO, proc.stdout), cast(BinaryIO, proc.stderr)
            keep = o.log_dir is not None
            r.pumps = [
                Pump(stdout, self._out, prefix, out_log if keep else None),
                Pump(stderr, self._err, prefix, err_log if keep else None),
            ]
            self._ranks.append(r)
            logger.debug("started %s: %s", r.label(), cmd)

    # ----- watching and stopping ----------------------------------------------------------

    def _poll(self) -> list[_Rank]:
        """Reap ranks that exited since the last poll; return them."""
        now = time.time()  # wall clock: compared with the error files' timestamps
        done = []
        for r in self._ranks:
            if r.returncode is None:
                rc = r.proc.poll()
                if rc is not None:
                    r.returncode, r.detected = rc, now
                    done.append(r)
        return done

    def _watch(self, deadline: float | None) -> str:
        """Block until 'success', 'failure', 'timeout' or 'signal'."""
        while True:
            self._poll()
            if self._signal is not None:
                return "signal"
            if any(r.returncode not in (None, 0) for r in self._ranks):
                return "failure"
            if all(r.returncode == 0 for r in self._ranks):
                return "success"
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout"
            time.sleep(_POLL)

    def _signal_group(self, r: _Rank, sig: int) -> None:
        try:
            os.killpg(r.proc.pid, sig)  # the rank leads its own session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_all(self, first_signal: int = signal.SIGTERM) -> None:
        """Signal every running rank, SIGKILL what is left after the grace period, reap all."""
        self._poll()
        running = [r for r in self._ranks if r.returncode is None]
        for r in running:
            r.stopped = True
            self._signal_group(r, first_signal)
        grace_end = time.monotonic() + self.opts.grace_period
        while running and time.monotonic() < grace_end and not self._escalate:
            time.sleep(_POLL)
            self._poll()
            running = [r for r in running if r.returncode is None]
        for r in running:
            if r.returncode is None:
                logger.debug("%s still running after the grace period: SIGKILL", r.label())
                self._signal_group(r, signal.SIGKILL)
        for r in running:
            try:
                r.returncode = r.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # unkillable (D state): report, don't hang
                self._say(f"{r.label()} did not die after SIGKILL; leaving it")
        self._drain()

    def _drain(self) -> None:
        """Let the pumps copy what the ranks wrote last (bounded: a grandchild may hold a pipe)."""
        for r in self._ranks:
            for p in r.pumps:
                p.join(timeout=2.0)

    # ----- reporting ----------------------------------------------------------------------

    def _root_cause(self) -> _Rank:
        # a rank the launcher stopped can still be the cause: it may have raised first and
        # been tearing down while the peers it left behind failed and exited before it
        failed = [r for r in self._ranks if r.returncode not in (None, 0)]

        def key(r: _Rank) -> tuple[float, int]:
            # earliest evidence of failure: when it recorded its exception, else when it was
            # seen dead on its own; a rank we stopped without a record is never the cause
            rec = rankside.read_error_file(r.error_file)
            t = rec.get("time") if rec else None
            own = math.inf if r.stopped else r.detected
            return (min(own, float(t)) if isinstance(t, (int, float)) else own, r.rank)

        return min(failed, key=key)

    def _summary(self, headline: str, root: _Rank | None) -> None:
        lines = [headline]
        if root is not None and root.returncode is not None:
            lines.append(f"root cause: {root.label()} {describe_returncode(root.returncode)}")
        self._say("\n".join(lines))
        if root is not None:
            rec = rankside.read_error_file(root.error_file)
            if rec and rec.get("traceback"):
                tb = str(rec["traceback"])
                self._say(f"uncaught exception on rank {root.rank}:")
                prefix = f"[rank{root.rank}]: "
                text = "".join(prefix + line + "\n" for line in tb.rstrip("\n").splitlines())
                self._err.write(text.encode("utf-8", "replace"))
        others = []
        for r in self._ranks:
            if r is root or r.returncode is None:
                continue
            how = describe_returncode(r.returncode)
            if r.stopped:
                how += " (stopped by the launcher)"
            rec = rankside.read_error_file(r.error_file)
            if rec:
                how += f" after {rec.get('exc_type')}: {str(rec.get('message', '')).splitlines()[0] if rec.get('message') else ''}"
            others.append(f"  {r.label()} {how}")
        if others:
            self._say("other ranks:\n" + "\n".join(others))

    # ----- the job ------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job (with restarts); return the launcher's exit code."""
        o = self.opts
        reservation = PortReservation() if o.master_port is None else None
        port = reservation.port if reservation is not None else int(o.master_port or 0)
        if o.log_dir is not None:
            os.makedirs(o.log_dir, exist_ok=True)
            files_dir, tmp_dir = o.log_dir, None
        else:
            tmp_dir = tempfile.mkdtemp(prefix="procgroup-run-")
            files_dir = tmp_dir
        previous = self._install_signal_handlers()
        deadline = time.monotonic() + o.timeout if o.timeout is not None else None
        try:
            logger.info(
                "node %d/%d: starting %d ranks, world size %d, master %s:%d",
                o.node_rank, o.nnodes, o.nproc_per_node, o.world_size, o.master_addr, port,
            )
            restart = 0
            while True:
                self._start(port, restart, files_dir)
                outcome = self._watch(deadline)
                if outcome == "success":
                    self._drain()
                    return 0
                if outcome == "signal":
                    sig = int(self._signal or signal.SIGTERM)
                    name = signal.Signals(sig).name
                    self._say(f"received {name}: stopping all ranks")
                    self._stop_all(sig if sig == signal.SIGINT else signal.SIGTERM)
                    return 128 + sig
                if outcome == "timeout":
                    alive = [r.rank for r in self._ranks if r.returncode is None]
                    self._stop_all()
                    self._summary(
                        f"job timed out after {o.timeout:g} s (--timeout); "
                        f"ranks still running were stopped: {alive}",
                        None,
                    )
                    return EXIT_TIMEOUT
                self._stop_all()  # first: the rank that raised may still be tearing down
                root = self._root_cause()
                if root.stopped and rankside.read_error_file(root.error_file):
                    # it died of its uncaught exception (exit code 1); our SIGTERM only cut
                    # its teardown short, after its peers had already noticed and failed
                    root.returncode = 1
                attempts = f"attempt {restart + 1} of {o.max_restarts + 1}"
                self._summary(f"job failed ({attempts})", root)
                if restart >= o.max_restarts:
                    return exit_code_for(root.returncode or 1)
                restart += 1
                if self._signal is not None:
                    return 128 + self._signal
                self._say(f"restarting all local ranks (restart {restart} of {o.max_restarts})")
        finally:
            for r in self._ranks:  # only after an error in the launcher itself
                if r.returncode is None and r.proc.poll() is None:
                    self._signal_group(r, signal.SIGKILL)
                    try:
                        r.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        logger.warning("%s did not die after SIGKILL", r.label())
            for sig, handler in previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
            if reservation is not None:
                reservation.close()
            if tmp_dir is not None:
                shutil.rmtree(tmp_dir, ignore_errors=True)
