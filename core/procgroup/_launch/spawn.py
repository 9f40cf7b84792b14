"""Starting the ranks of one node: the job token, each rank's environment and files, and
the processes (directly, or all through one mpiexec with ``--backend mpi``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any, BinaryIO, cast

from procgroup._auth import ENV_TOKEN, new_token
from procgroup._launch import rankside
from procgroup._launch.mpi import mpiexec_command
from procgroup._launch.options import STDERR, STDOUT
from procgroup._launch.output import Pump, Tail
from procgroup._launch.ranks import NodeJob, Rank


logger = logging.getLogger(__name__)


class Spawning(NodeJob):
    """The Supervisor's part that starts ranks (a mixin: the state is the Supervisor's)."""

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
        if self._flight_dir is not None and not o.no_python:
            env[rankside.FLIGHT_DIR_ENV] = self._flight_dir
        else:
            env.pop(rankside.FLIGHT_DIR_ENV, None)
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
        # an empty directory per attempt: a dump found there is this attempt's
        self._flight_dir = os.path.join(run_dir, f"flight{restart}")
        os.makedirs(self._flight_dir, exist_ok=True)
        for local_rank in range(o.nproc_per_node):
            rank = o.global_rank(local_rank)
            files = self._files(files_dir, run_dir, rank, restart)
            for key in ("error", "status"):
                if os.path.exists(files[key]):
                    os.unlink(files[key])
            r = Rank(local_rank, rank, o.node_rank, None, files["error"], files["status"])
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


def _fifo_opener(path: str) -> Any:
    """Open a rank's named pipe for reading (blocks until the rank opens its end)."""
    return lambda: open(path, "rb")


__all__ = ["Spawning"]
