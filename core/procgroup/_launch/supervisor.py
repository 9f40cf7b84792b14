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
from typing import Any, BinaryIO, cast

from procgroup._auth import ENV_TOKEN, new_token
from procgroup._launch import rankside
from procgroup._launch.mpi import mpiexec_command
from procgroup._launch.options import STDERR, STDOUT, LaunchOptions
from procgroup._launch.output import LockedStream, Pump, Tail
from procgroup._launch.ports import PortReservation

logger = logging.getLogger(__name__)

EXIT_TIMEOUT = 124  # like coreutils timeout(1)
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
class _Rank:
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
        self._mpiexec: subprocess.Popen[bytes] | None = None  # --backend mpi: one for all ranks
        self._mpiexec_tail = Tail()
        self._mpiexec_pumps: list[Pump] = []
        self._fifos: list[str] = []
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

    def _rank_env(self, local_rank: int | str, rank: int | str, port: int, restart: int,
                  files: dict[str, str]) -> dict[str, str]:
        o = self.opts
        env = dict(os.environ)
        env.update(o.extra_env)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(o.world_size),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(o.nproc_per_node),
            GROUP_RANK=str(o.node_rank),
            GROUP_WORLD_SIZE=str(o.nnodes),
            ROLE_RANK=str(rank),
            ROLE_NAME=o.role,
            ROLE_WORLD_SIZE=str(o.world_size),
            MASTER_ADDR=o.master_addr,
            MASTER_PORT=str(port),
            PROCGROUP_RESTART_COUNT=str(restart),
            TORCHELASTIC_RESTART_COUNT=str(restart),
            TORCHELASTIC_MAX_RESTARTS=str(o.max_restarts),
            TORCHELASTIC_RUN_ID=o.run_id,
            PROCGROUP_ERROR_FILE=files["error"],
            TORCHELASTIC_ERROR_FILE=files["error"],
            PROCGROUP_STATUS_FILE=files["status"],
            PROCGROUP_LAUNCHER_PID=str(os.getpid()),
            PYTHONUNBUFFERED="1",
        )
        if self._token is not None:
            env[ENV_TOKEN] = self._token
        if o.backend is not None:
            env["PROCGROUP_BACKEND"] = o.backend
        if o.prefix:
            env["PROCGROUP_OUTPUT_PREFIXED"] = "1"  # log lines need no "[rank N]" of their own
        else:
            env.pop("PROCGROUP_OUTPUT_PREFIXED", None)
        if o.nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = "1"  # n ranks x all cores of BLAS threads would thrash
        if self._mpi:
            env[rankside.MPI_LAUNCH_ENV] = "1"
            env[rankside.STDOUT_FIFO_ENV] = files["stdout_fifo"]
            env[rankside.STDERR_FIFO_ENV] = files["stderr_fifo"]
        else:
            for var in (rankside.MPI_LAUNCH_ENV, rankside.STDOUT_FIFO_ENV, rankside.STDERR_FIFO_ENV):
                env.pop(var, None)
        return env

    @property
    def _mpi(self) -> bool:
        return self.opts.mpiexec is not None

    def _command(self) -> list[str]:
        o = self.opts
        boot = os.path.abspath(rankside.__file__)
        if o.no_python:
            return [sys.executable, "-u", boot, "--exec", o.target, *o.target_args]
        if o.module:
            return [sys.executable, "-u", boot, "-m", o.target, *o.target_args]
        return [sys.executable, "-u", boot, o.target, *o.target_args]

    def _files(self, files_dir: str, run_dir: str, rank: int | str, restart: int) -> dict[str, str]:
        stem = f"rank{rank}" if restart == 0 else f"rank{rank}.restart{restart}"
        return {
            "stdout": os.path.join(files_dir, f"{stem}.stdout.log"),
            "stderr": os.path.join(files_dir, f"{stem}.stderr.log"),
            "error": os.path.join(files_dir, f"{stem}.error.json"),
            "status": os.path.join(run_dir, f"{stem}.status.json"),
            "stdout_fifo": os.path.join(run_dir, f"{stem}.stdout.fifo"),
            "stderr_fifo": os.path.join(run_dir, f"{stem}.stderr.fifo"),
        }

    def _start(self, port: int, restart: int, files_dir: str, run_dir: str) -> None:
        o = self.opts
        cmd = self._command()
        self._ranks = []
        self._fifos = []
        for local_rank in range(o.nproc_per_node):
            rank = o.global_rank(local_rank)
            files = self._files(files_dir, run_dir, rank, restart)
            for key in ("error", "status"):
                if os.path.exists(files[key]):
                    os.unlink(files[key])
            r = _Rank(local_rank, rank, o.node_rank, None, files["error"], files["status"])
            sources: list[Any]
            if self._mpi:
                for key in ("stdout_fifo", "stderr_fifo"):
                    os.mkfifo(files[key], 0o600)
                    self._fifos.append(files[key])
                sources = [_fifo_opener(files["stdout_fifo"]), _fifo_opener(files["stderr_fifo"])]
            else:
                proc = subprocess.Popen(
                    cmd,
                    env=self._rank_env(local_rank, rank, port, restart, files),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
                r.proc, r.pid = proc, proc.pid
                sources = [cast(BinaryIO, proc.stdout), cast(BinaryIO, proc.stderr)]
            prefix = f"[rank{rank}]: ".encode() if o.prefix else b""
            r.pumps = [
                Pump(src, dest if o.shown(local_rank, bit) else None, prefix,
                     files[name] if o.logged(local_rank, bit) else None, r.tail)
                for src, dest, bit, name in ((sources[0], self._out, STDOUT, "stdout"),
                                             (sources[1], self._err, STDERR, "stderr"))
            ]
            self._ranks.append(r)
            logger.debug("started %s: %s", r.label(), cmd)
        if self._mpi:
            self._start_mpiexec(cmd, port, restart, files_dir, run_dir)

    def _start_mpiexec(self, cmd: list[str], port: int, restart: int, files_dir: str,
                       run_dir: str) -> None:
        """One mpiexec for all local ranks; their per-rank paths are filled in by rankside."""
        o = self.opts
        template = self._files(files_dir, run_dir, "{rank}", restart)
        env = self._rank_env("{rank}", "{rank}", port, restart, template)
        boot = [sys.executable, os.path.abspath(rankside.__file__), "--exec-mpiexec"]
        full = boot + mpiexec_command(cast(str, o.mpiexec), o.nproc_per_node, cmd)
        self._mpiexec_tail = Tail()
        self._mpiexec = subprocess.Popen(full, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self._mpiexec_pumps = [Pump(cast(BinaryIO, self._mpiexec.stdout), None, b"[mpiexec]: ",
                                    None, self._mpiexec_tail)]
        logger.debug("started mpiexec (pid %d): %s", self._mpiexec.pid, full)

    # ----- watching and stopping ----------------------------------------------------------

    def _poll(self) -> list[_Rank]:
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

    def _signal_group(self, r: _Rank, sig: int) -> None:
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

    def _lingers(self, r: _Rank) -> bool:
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

    # ----- reporting ----------------------------------------------------------------------

    def _failure_time(self, r: _Rank) -> tuple[int, float, int]:
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

    def _root_cause(self) -> _Rank | None:
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

    def _summary(self, headline: str, root: _Rank | None) -> None:
        lines = [headline]
        if root is not None and root.returncode is not None:
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
                attempts = f"attempt {restart + 1} of {o.max_restarts + 1}"
                if o.keep_going:
                    failed = [r.rank for r in self._ranks if r.returncode not in (None, 0)]
                    attempts = f"--keep-going: the others ran on; failed ranks: {failed}"
                self._summary(f"job failed ({attempts})", root)
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
                signal.signal(sig, handler)  # type: ignore[arg-type]
            if reservation is not None:
                reservation.close()
            shutil.rmtree(run_dir, ignore_errors=True)


def _fifo_opener(path: str) -> Any:
    """Open a rank's named pipe for reading (blocks until the rank opens its end)."""
    return lambda: open(path, "rb")
