"""Data-parallel SGD, the tutorial's "distributed training" on a NumPy model.

    python examples/tutorial_sgd.py -n 4 [--arrays torch] [--backend gloo]

Each rank holds a shard of one data set (a linear regression problem), computes the
gradient of the mean squared error on its shard, and averages the gradients over all
ranks with all_reduce before every update (the tutorial's ``average_gradients``), so
every rank keeps the same weights; the weights are broadcast from rank 0 at the start.
"""

from __future__ import annotations

import numpy as np
import tutorial_common as common
import procgroup as dist

ROWS, FEATURES, STEPS, LR = 1024, 8, 200, 0.1


def partition(rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The same data set on every rank (a fixed seed), this rank's rows of it."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    y = x @ np.arange(1, FEATURES + 1, dtype=np.float32)
    rows = np.array_split(np.arange(ROWS), size)[rank]
    return x[rows], y[rows]


def average_gradients(grad) -> None:  # type: ignore[no-untyped-def]  # the tutorial's functions stay untyped
    """Sum the gradient over all ranks, in place, and divide by their number."""
    dist.all_reduce(grad, op=dist.ReduceOp.SUM)
    grad /= dist.get_world_size()


def run(rank: int, size: int) -> None:
    x, y = partition(rank, size)
    weights = common.zeros(FEATURES)
    if rank == 0:
        weights += 0.5  # rank 0's initial model; broadcast makes it everyone's
    dist.broadcast(weights, src=0)
    w = common.as_numpy(weights)  # a view: updates below change the tensor too
    for _ in range(STEPS):
        grad_np = (2.0 / len(x)) * (x.T @ (x @ w - y))
        grad = common.zeros(FEATURES)
        common.as_numpy(grad)[:] = grad_np
        average_gradients(grad)
        w -= LR * common.as_numpy(grad)
    loss = float(np.mean((x @ w - y) ** 2))
    print("Rank ", rank, " loss ", loss)
    check = common.zeros(FEATURES)
    common.as_numpy(check)[:] = w
    dist.broadcast(check, src=0)
    assert np.allclose(common.as_numpy(check), w), "the ranks' models drifted apart"
    assert loss < 1e-3, loss


if __name__ == "__main__":
    common.main(run, default_size=4)
