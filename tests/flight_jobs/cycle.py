"""A stuck job: rank 1 receives from rank 2 while rank 2 is in a barrier."""
import numpy as np

import procgroup as dist


def main() -> None:
    dist.init_process_group("tcp")
    rank = dist.get_rank()
    buf = np.zeros(4, dtype=np.float32)
    dist.all_reduce(buf)
    if rank == 1:
        dist.recv(buf, src=2)  # rank 2 never sends
    dist.barrier()


if __name__ == "__main__":
    main()
