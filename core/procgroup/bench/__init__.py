"""procgroup-bench: measure procgroup's collectives and send/recv over a size sweep.

Per size it reports the median time, algbw and busbw (nccl-tests definitions), for
several backends and comparisons (torch.distributed gloo, raw mpi4py, raw pygloo) run
side by side in one job, so every ratio comes from one run. ``procgroup-bench
master-worker`` measures master-worker mode against torch.distributed.rpc instead. ``procgroup-bench -np 2``
starts its own ranks; under mpiexec or procgroup-run it is one rank of theirs. Output: a
table on stdout, optional ``--json``, ``--csv`` and ``--plot`` (matplotlib, the
``procgroup[bench]`` extra). See docs/benchmarking.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from procgroup.errors import ProcGroupError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: parse, then spawn the ranks or, under a launcher, be one."""
    from ._launch import external_launcher, spawn_job
    from ._options import parse_options
    from ._rank import run_rank

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["master-worker"]:
        from ._master_worker import main as master_worker

        try:
            return master_worker(args[1:])
        except ProcGroupError as exc:
            print(f"procgroup-bench master-worker: error: {exc}", file=sys.stderr)
            return 2
    try:
        opts = parse_options(args)
        launcher = external_launcher()
        if launcher is not None:
            return run_rank(opts, launcher)
        return spawn_job(opts, args)
    except ProcGroupError as exc:
        print(f"procgroup-bench: error: {exc}", file=sys.stderr)
        return 2
