"""Rank 1 of 4 fails mid-job; rank 0, which sees it, leaves; the others must name rank 1."""
import sys

import numpy as np

import procgroup as dist


def main() -> None:
    dist.init_process_group("tcp")
    rank = dist.get_rank()
    x = np.ones(4, dtype=np.float32)
    dist.all_reduce(x)
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    try:
        if rank == 0:
            dist.recv(x, src=1)  # sees rank 1 leave, and fails
        else:
            dist.recv(x, src=0)  # sees rank 0 leave: the error must name rank 1's failure
    except dist.errors.PeerError as exc:
        print(f"survivor {rank} error: {str(exc)!r}", flush=True)
        raise
    sys.exit(0)


if __name__ == "__main__":
    main()
