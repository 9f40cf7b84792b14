"""procgroup-run: start the ranks of a procgroup job on this node (like torchrun).

Usage::

    procgroup-run --nproc-per-node 4 train.py --lr 0.1
    procgroup-run -n 2 --backend tcp -m mypkg.train --epochs 3
    # two nodes: run on each, with its --node-rank
    procgroup-run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -n 8 train.py

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT (and PROCGROUP_BACKEND with --backend), so ``init_process_group()`` with the
default ``env://`` needs no arguments. See docs/launcher.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from procgroup._launch.mpi import find_mpiexec, wants_mpiexec
from procgroup._launch.options import (
    LaunchOptions,
    expand_std,
    parse_endpoint,
    parse_nnodes,
    parse_nproc,
    parse_ranks,
    parse_std,
)
from procgroup._launch.supervisor import Supervisor
from procgroup._logging import level_from_env
from procgroup.errors import InvalidArgumentError, ProcGroupError

logger = logging.getLogger(__name__)

EXIT_USAGE = 2

__all__ = ["build_parser", "main", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (also used by docs and tests).

    Every option has torchrun's spelling too (``--nproc_per_node``, ``--max_restarts``...):
    the same command line works with either launcher.
    """
    p = argparse.ArgumentParser(
        prog="procgroup-run",
        description="Start the local ranks of a procgroup job (torchrun-style env:// variables).",
        allow_abbrev=False,
    )

    def opt(*names: str, **kw: Any) -> None:
        spellings = list(names)
        for n in names:  # torchrun accepts both --a-b and --a_b
            if n.startswith("--") and "-" in n[2:]:
                spellings.append("--" + n[2:].replace("-", "_"))
        p.add_argument(*spellings, **kw)

    opt("-n", "--nproc-per-node", default="1", metavar="N",
        help="ranks to start on this node: a number, or auto (GPUs if any, else CPUs), "
             "cpu (CPU count), gpu (CUDA devices) (default 1)")
    opt("--nnodes", default="1", metavar="N", help="number of nodes, N or N:N (default 1)")
    opt("--node-rank", type=int, default=None,
        help="this node's index in [0, nnodes) (default 0; required with --nnodes > 1)")
    opt("--master-addr", default=None,
        help="address of the node that runs rank 0 (default 127.0.0.1; in a Slurm job with "
             "--nnodes > 1 the first node of the step)")
    opt("--master-port", type=int, default=None,
        help="rank 0's store port; a single-node job picks a free one when omitted, a Slurm "
             "job derives one from its job and step ids")
    opt("--rdzv-endpoint", default=None, metavar="HOST[:PORT]",
        help="torchrun's spelling of --master-addr/--master-port (port 29400 when omitted)")
    opt("--rdzv-backend", default="static", choices=("static", "c10d"),
        help="accepted for torchrun compatibility; the rendezvous is always rank 0's store")
    opt("--rdzv-id", default="none", metavar="ID",
        help="the job's id, exported as TORCHELASTIC_RUN_ID")
    opt("--rdzv-conf", default="", metavar="K=V,...", help="accepted and ignored (torchrun's)")
    opt("--standalone", action="store_true",
        help="single-node job on 127.0.0.1 with a free port (any --master-*/--rdzv-* "
             "value is ignored, as torchrun does)")
    opt("--backend", default=None,
        help="exported as PROCGROUP_BACKEND, used by init_process_group() when its backend is "
             "omitted; with mpi the ranks are started through mpiexec as one MPI world")
    opt("--no-prefix", action="store_true", help="do not prefix output lines with [rankN]: ")
    opt("--log-dir", default=None, metavar="DIR",
        help="also write rank<N>.stdout.log / .stderr.log / .error.json into DIR")
    opt("-r", "--redirects", default="0", metavar="STD",
        help="send these streams to the log files only: 0 none, 1 stdout, 2 stderr, 3 both, "
             "or per local rank, e.g. 0:3,1:1")
    opt("-t", "--tee", default="0", metavar="STD",
        help="also write these streams to the log files (same values as --redirects)")
    opt("--local-ranks-filter", default=None, metavar="RANKS",
        help="show only these local ranks' output on the console, e.g. 0 or 0,2 "
             "(log files are complete)")
    opt("--max-restarts", type=int, default=0, metavar="K",
        help="restart all local ranks up to K times after a failure (default 0)")
    opt("--keep-going", action="store_true",
        help="when a rank fails, let the others run on (they may shrink() and go on); the exit "
             "status and the summary still name every rank that failed (docs/fault-tolerance.md)")
    opt("--monitor-interval", type=float, default=0.05, metavar="SECONDS",
        help="how often the ranks are checked (default 0.05)")
    opt("--start-method", default="spawn", choices=("spawn", "fork", "forkserver"),
        help="accepted for torchrun compatibility; every rank is a fresh process")
    opt("--role", default="default", help="exported as ROLE_NAME (default 'default')")
    opt("--local-addr", default=None, help="accepted and ignored (torchrun's)")
    opt("--timeout", type=float, default=None, metavar="SECONDS",
        help="stop the whole job (exit 124) when it runs longer than this")
    opt("--grace-period", type=float, default=5.0, metavar="SECONDS",
        help="time between SIGTERM and SIGKILL when stopping ranks (default 5)")
    opt("-m", "--module", action="store_true", help="run TARGET as a module, like python -m")
    opt("--no-python", action="store_true",
        help="execute TARGET directly instead of with python (a program or shell script)")
    opt("--run-path", action="store_true",
        help="run TARGET with runpy.run_path (the default for scripts; overrides --no-python)")
    p.add_argument("target", metavar="TARGET", help="script path (or module name with -m)")
    p.add_argument("target_args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments passed to the script")
    return p


def parse_args(argv: Sequence[str] | None = None) -> LaunchOptions:
    """Parse and validate the command line; raise InvalidArgumentError on a bad value."""
    ns = build_parser().parse_args(argv)
    nproc = parse_nproc(ns.nproc_per_node)
    nnodes = parse_nnodes(ns.nnodes)
    addr, port = ns.master_addr, ns.master_port
    if ns.rdzv_endpoint is not None:
        if addr is not None or port is not None:
            raise InvalidArgumentError(
                "give either --rdzv-endpoint or --master-addr/--master-port, not both"
            )
        addr, port = parse_endpoint(ns.rdzv_endpoint)
        if port == 0:
            port = None  # torchrun's "localhost:0": any free port (single node)
    if ns.standalone:
        if nnodes != 1:
            raise InvalidArgumentError(f"--standalone is for one node, got --nnodes {ns.nnodes}")
        if addr is not None or port is not None:
            logger.info("--standalone: ignoring the given master address/port")
        addr, port = "127.0.0.1", None
    if nnodes > 1 and (addr is None or port is None):
        # under srun/sbatch every node's launcher derives the same master (rendezvous/_slurm.py)
        from procgroup.rendezvous import _slurm

        if _slurm.in_job(os.environ):
            if addr is None:
                addr = _slurm.master_addr(os.environ, "procgroup-run")[0]
            if port is None:
                port = _slurm.master_port(os.environ)
    if ns.node_rank is None and nnodes > 1:
        raise InvalidArgumentError(
            f"--node-rank is required with --nnodes {nnodes}: give every node's launcher its "
            "index (procgroup-run has no dynamic rendezvous that assigns them)"
        )
    backend = ns.backend if ns.backend is not None else None
    effective = backend if backend is not None else os.environ.get("PROCGROUP_BACKEND")
    mpiexec = None
    if wants_mpiexec(effective):
        if nnodes > 1:
            raise InvalidArgumentError(
                "--backend mpi starts the ranks of one node through mpiexec; for several "
                "nodes start the job with mpiexec itself (mpiexec -n N -hosts h1,h2 python "
                "train.py) instead of procgroup-run"
            )
        mpiexec = find_mpiexec()
    run_path = ns.run_path
    target = ns.target
    if run_path:
        if ns.module:
            raise InvalidArgumentError("--run-path and -m exclude each other")
        target = os.path.abspath(target)
    return LaunchOptions(
        target=target,
        target_args=tuple(ns.target_args),
        module=ns.module,
        no_python=ns.no_python and not run_path,
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=ns.node_rank or 0,
        master_addr=addr if addr is not None else "127.0.0.1",
        master_port=port,
        backend=backend,
        prefix=not ns.no_prefix,
        log_dir=ns.log_dir,
        redirects=expand_std(parse_std(ns.redirects, "--redirects"), nproc),
        tee=expand_std(parse_std(ns.tee, "--tee"), nproc),
        local_ranks_filter=(parse_ranks(ns.local_ranks_filter, "--local-ranks-filter")
                            if ns.local_ranks_filter is not None else None),
        max_restarts=ns.max_restarts,
        keep_going=ns.keep_going,
        timeout=ns.timeout,
        grace_period=ns.grace_period,
        monitor_interval=ns.monitor_interval,
        run_id=ns.rdzv_id,
        role=ns.role,
        mpiexec=mpiexec,
    ).validate()


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns (and exits with) the launcher's exit code."""
    try:
        level = level_from_env()
        logging.basicConfig(level=level if level is not None else logging.WARNING,
                            format="procgroup-run: %(levelname)s: %(name)s: %(message)s")
        opts = parse_args(argv)
    except ProcGroupError as err:
        sys.stderr.write(f"procgroup-run: error: {err}\n")
        return EXIT_USAGE
    return Supervisor(opts).run()


if __name__ == "__main__":
    sys.exit(main())
