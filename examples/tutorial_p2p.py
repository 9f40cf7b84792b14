"""Point to point, blocking and non-blocking, as in the PyTorch tutorial's first programs.

    python examples/tutorial_p2p.py [--arrays torch] [--backend gloo] [-n 2]

Rank 0 adds one to its zeros and sends them to rank 1 (``dist.send(tensor=..., dst=1)``),
then again without blocking (``isend``/``irecv`` and ``wait``). Other ranks, if any, look on.
"""

from __future__ import annotations

import tutorial_common as common
import procgroup as dist


def run_blocking(rank: int, size: int) -> None:
    tensor = common.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)  # to process 1
    elif rank == 1:
        dist.recv(tensor=tensor, src=0)  # from process 0
    print("Rank ", rank, " has data ", tensor[0])
    assert float(tensor[0]) == (1.0 if rank < 2 else 0.0)


def run_nonblocking(rank: int, size: int) -> None:
    tensor = common.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending")
    elif rank == 1:
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving")
    if req is not None:
        req.wait()  # only now may the tensor be read (rank 1) or changed (rank 0)
    print("Rank ", rank, " has data ", tensor[0])
    assert float(tensor[0]) == (1.0 if rank < 2 else 0.0)


def run(rank: int, size: int) -> None:
    run_blocking(rank, size)
    run_nonblocking(rank, size)


if __name__ == "__main__":
    common.main(run, default_size=2)
