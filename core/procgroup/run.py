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
import sys
from collections.abc import Sequence

from procgroup._launch.options import LaunchOptions
from procgroup._launch.supervisor import Supervisor
from procgroup.errors import ProcGroupError

logger = logging.getLogger(__name__)

EXIT_USAGE = 2

__all__ = ["build_parser", "main", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (also used by docs and tests)."""
    p = argparse.ArgumentParser(
        prog="procgroup-run",
        description="Start the local ranks of a procgroup job (torchrun-style env:// variables).",
        allow_abbrev=False,
    )
    p.add_argument("-n", "--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   metavar="N", help="ranks to start on this node (default 1)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0,
                   help="this node's index in [0, nnodes) (default 0)")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1",
                   help="address of the node that runs rank 0 (default 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="rank 0's store port; a single-node job picks a free one when omitted")
    p.add_argument("--backend", default=None,
                   help="exported as PROCGROUP_BACKEND, used by init_process_group() "
                        "when its backend is omitted")
    p.add_argument("--no-prefix", action="store_true",
                   help="do not prefix output lines with [rankN]: ")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="also write rank<N>.stdout.log / .stderr.log / .error.json into DIR")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="restart all local ranks up to K times after a failure (default 0)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop the whole job (exit 124) when it runs longer than this")
    p.add_argument("--grace-period", type=float, default=5.0, metavar="SECONDS",
                   help="time between SIGTERM and SIGKILL when stopping ranks (default 5)")
    p.add_argument("-m", "--module", action="store_true",
                   help="run TARGET as a module, like python -m")
    p.add_argument("target", metavar="TARGET", help="script path (or module name with -m)")
    p.add_argument("target_args", nargs=argparse.REMAINDER, metavar="ARGS",
                   help="arguments passed to the script")
    return p


def parse_args(argv: Sequence[str] | None = None) -> LaunchOptions:
    """Parse and validate the command line; raise InvalidArgumentError on a bad value."""
    ns = build_parser().parse_args(argv)
    return LaunchOptions(
        target=ns.target,
        target_args=tuple(ns.target_args),
        module=ns.module,
        nproc_per_node=ns.nproc_per_node,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        backend=ns.backend,
        prefix=not ns.no_prefix,
        log_dir=ns.log_dir,
        max_restarts=ns.max_restarts,
        timeout=ns.timeout,
        grace_period=ns.grace_period,
    ).validate()


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns (and exits with) the launcher's exit code."""
    logging.basicConfig(level=logging.WARNING, format="procgroup-run: %(levelname)s: %(message)s")
    try:
        opts = parse_args(argv)
    except ProcGroupError as err:
        sys.stderr.write(f"procgroup-run: error: {err}\n")
        return EXIT_USAGE
    return Supervisor(opts).run()


if __name__ == "__main__":
    sys.exit(main())
