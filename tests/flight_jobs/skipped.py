"""A stuck job: rank 2 skips one all_reduce and goes on to a broadcast."""
import numpy as np

import procgroup as dist


def main() -> None:
    dist.init_process_group("tcp")
    rank = dist.get_rank()
    grads = np.ones(8, dtype=np.float32)
    for step in range(3):
        if not (rank == 2 and step == 2):
            dist.all_reduce(grads)
        dist.broadcast(grads, src=0)


if __name__ == "__main__":
    main()
