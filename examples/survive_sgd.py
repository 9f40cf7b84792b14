"""A training loop that survives a rank's death: full-batch SGD on a linear model.

Run it under procgroup-run with --keep-going, and kill a rank mid-run::

    procgroup-run --nproc-per-node 4 --keep-going examples/survive_sgd.py --kill-rank 2 --kill-step 20

Every rank makes the same data set (a fixed seed) and works on its slice. Each step
all-reduces the gradient; ``agree`` then tells every survivor, identically, whether the
step completed everywhere. If it did not (a rank died), the survivors ``shrink`` the
world, re-split the data over the new world and redo the step. The full-batch gradient
does not depend on how the rows are split, so the final loss equals that of a run that
had fewer ranks from the start (within float rounding). What the dead rank held is not
needed: every survivor can rebuild the data, and the weights are the same on all ranks.
"""

from __future__ import annotations

import argparse
import os
import signal

import numpy as np
import procgroup as pg

ROWS, FEATURES = 4096, 16


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, FEATURES))
    w_true = rng.standard_normal(FEATURES)
    y = x @ w_true + 0.1 * rng.standard_normal(ROWS)
    return x, y


def my_slice(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This rank's rows in the current world (re-split after every shrink)."""
    bounds = np.linspace(0, ROWS, pg.get_world_size() + 1).astype(int)
    lo, hi = bounds[pg.get_rank()], bounds[pg.get_rank() + 1]
    return x[lo:hi], y[lo:hi]


def loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Mean squared error over the whole data set (summed over the slices)."""
    part = np.array([float(np.sum((x @ w - y) ** 2))])
    pg.all_reduce(part)
    return float(part[0]) / ROWS


def train(steps: int, lr: float, kill_rank: int, kill_step: int) -> float:
    x_all, y_all = make_data()
    x, y = my_slice(x_all, y_all)
    w = np.zeros(FEATURES)
    step = 0
    original_rank = pg.get_rank()
    while step < steps:
        if step == kill_step and original_rank == kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # a rank dies mid-run
        grad = np.empty(FEATURES + 1)
        grad[:FEATURES] = 2 * x.T @ (x @ w - y)
        grad[FEATURES] = len(y)  # rows that contributed, to check nothing is missing
        try:
            pg.all_reduce(grad)
            done = True
        except (pg.PeerError, pg.GroupRevokedError):
            done = False
        if not pg.agree(done and grad[FEATURES] == ROWS):
            pg.shrink()  # the survivors go on as a smaller world
            x, y = my_slice(x_all, y_all)
            continue  # redo this step: every survivor discards it alike
        w -= lr * grad[:FEATURES] / ROWS
        step += 1
    return loss(w, x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--kill-rank", type=int, default=-1, help="this rank kills itself (SIGKILL)")
    parser.add_argument("--kill-step", type=int, default=-1, help="... at this step")
    args = parser.parse_args()
    pg.init_process_group("tcp")
    start = pg.get_world_size()
    final = train(args.steps, args.lr, args.kill_rank, args.kill_step)
    if pg.get_rank() == 0:
        print(f"final loss {final:.12e} on {pg.get_world_size()} of {start} ranks", flush=True)
    pg.destroy_process_group()


if __name__ == "__main__":
    main()
