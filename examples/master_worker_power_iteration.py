"""Power iteration split over the worker nodes, driven from one program (master-worker mode).

    procgroup-run --nproc-per-node 3 examples/master_worker_power_iteration.py   # a master + 2 nodes
    mpiexec -n 3 python examples/master_worker_power_iteration.py --backend mpi

The symmetric matrix A is split by rows: node k holds the block A_k and a full copy of
the vector v. Each step every node computes its rows of A @ v (asynchronously, all nodes
at once), the blocks are summed into a full vector on every node with remote.all_reduce
(a collective of the job's backend among the workers, no data through the master), and
each node normalises its copy. The master only sends A once and reads one number per
check. The result is compared with NumPy's eigvalsh.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import procgroup as pg

ap = argparse.ArgumentParser()
ap.add_argument("--backend", default=None)
ap.add_argument("-n", type=int, default=1500, help="matrix size")
ap.add_argument("--steps", type=int, default=200)
args = ap.parse_args()

pg.init_master_worker(args.backend)  # the workers serve from here on; the rest runs on the master only
nodes = pg.num_nodes()
if nodes < 1:
    raise SystemExit("start at least 2 ranks: a master and a node")

rng = np.random.default_rng(0)
m = rng.standard_normal((args.n, args.n))
a = (m + m.T) / 2
a[np.diag_indices(args.n)] += np.linspace(0, 4 * np.sqrt(args.n), args.n)
a[-1, -1] += 8 * np.sqrt(args.n)  # a clear dominant eigenvalue: the iteration converges fast
rows = np.array_split(np.arange(args.n), nodes)

t0 = time.perf_counter()
blocks = [pg.remote.send(a[r], node=k) for k, r in enumerate(rows)]  # node k: rows r of A
v = [pg.remote.full(args.n, 1 / np.sqrt(args.n), node=k) for k in range(nodes)]
full = [pg.remote.zeros(args.n, node=k) for k in range(nodes)]
estimate = 0.0
for step in range(args.steps):
    for k, r in enumerate(rows):  # every node: its rows of A @ v, the others' rows zero
        full[k].fill(0.0)
        full[k][r[0]:r[-1] + 1] = blocks[k] @ v[k]
    pg.remote.all_reduce(full)  # now every node holds y = A @ v
    norms = [np.sqrt((y * y).sum()) for y in full]  # remote 0-d arrays, nothing waits yet
    for k in range(nodes):
        np.divide(full[k], norms[k], out=v[k])  # in place on each node
    if step % 25 == 24:
        new = float(norms[0])  # a sync point: waits for node 0's work so far
        if abs(new - estimate) < 1e-9 * abs(new):
            break
        estimate = new
estimate = float(norms[0])
elapsed = time.perf_counter() - t0

exact = np.abs(np.linalg.eigvalsh(a)).max()
print(f"{nodes} node(s), n={args.n}: dominant |eigenvalue| {estimate:.6f} after {step + 1} steps "
      f"in {elapsed:.2f}s; numpy.linalg.eigvalsh: {exact:.6f}; relative error {abs(estimate - exact) / exact:.1e}")
print(f"memory on node 0: {pg.remote.memory_info(0)}")
assert abs(estimate - exact) / exact < 1e-6, "power iteration did not converge to the dominant eigenvalue"
pg.destroy_process_group()  # ends the workers (exit status 0)
