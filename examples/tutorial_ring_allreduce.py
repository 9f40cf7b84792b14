"""A hand-written ring all-reduce (the tutorial's "our own ring-allreduce"), checked
against dist.all_reduce.

    python examples/tutorial_ring_allreduce.py -n 4 [--arrays torch] [--backend gloo]

Each of the size-1 steps sends one buffer to the right neighbour without blocking while
receiving the other from the left, then adds what arrived; the two buffers swap roles
each step so a send never reads the buffer being received into.
"""

from __future__ import annotations

import tutorial_common as common
import procgroup as dist


def ring_allreduce(send, recv) -> None:  # type: ignore[no-untyped-def]  # the tutorial's functions stay untyped
    """recv = the sum over all ranks of send."""
    rank, size = dist.get_rank(), dist.get_world_size()
    outgoing, incoming, total = send.clone() if hasattr(send, "clone") else send.copy(), send * 0, send + 0
    right, left = (rank + 1) % size, (rank - 1 + size) % size
    for _ in range(size - 1):
        pending = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        total[:] += incoming[:]
        pending.wait()
        outgoing, incoming = incoming, outgoing  # pass on what just arrived
    recv[:] = total[:]


def run(rank: int, size: int) -> None:
    mine = common.ones(8) * (rank + 1)
    result = common.zeros(8)
    ring_allreduce(mine, result)
    expected = common.ones(8) * (rank + 1)
    dist.all_reduce(expected)
    print("Rank ", rank, " has data ", result[0])
    assert (common.as_numpy(result) == common.as_numpy(expected)).all()
    assert float(result[0]) == size * (size + 1) / 2


if __name__ == "__main__":
    common.main(run, default_size=4)
