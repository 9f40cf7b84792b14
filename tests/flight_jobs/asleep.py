"""A stuck job: rank 2 sleeps in its data loader before the 5th all_reduce."""
import time

import numpy as np

import procgroup as dist


def load_batch(rank: int, step: int) -> np.ndarray:
    if rank == 2 and step == 4:
        time.sleep(60)  # the data loader hangs here
    return np.full(2, float(rank), dtype=np.float32)


def main() -> None:
    dist.init_process_group("tcp")
    rank = dist.get_rank()
    for step in range(6):
        if step == 4:
            print(f"step {step}", flush=True)  # the test's cue: the stuck step is reached
        batch = load_batch(rank, step)
        dist.all_reduce(batch)


if __name__ == "__main__":
    main()
