"""Entry point of one rank started by ``mpiexec`` for :func:`procgroup.testing.spawn`."""

from __future__ import annotations

import os
import pickle
import sys
import traceback


def _rank_from_env() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def main(tmp: str) -> None:
    with open(os.path.join(tmp, "job.pkl"), "rb") as f:
        job, path = pickle.load(f)
    sys.path[:] = path
    from procgroup.testing._spawn import run_rank

    rank = _rank_from_env()
    result: tuple[bool, bytes | str]  # the pickled return value, or the traceback
    try:
        result = (True, pickle.dumps(run_rank(job, rank)))
    except BaseException:  # noqa: BLE001 - reported to the test
        result = (False, traceback.format_exc())
    with open(os.path.join(tmp, f"result-{rank}.pkl.tmp"), "wb") as f:
        pickle.dump(result, f)
    os.replace(os.path.join(tmp, f"result-{rank}.pkl.tmp"), os.path.join(tmp, f"result-{rank}.pkl"))


if __name__ == "__main__":
    main(sys.argv[1])
