"""A 4-rank tour of procgroup: every collective once, each rank printing what it got.

Run it with the launcher (ranks, addresses and the backend come from the environment):

    procgroup-run --nproc-per-node 4 examples/demo.py            # tcp, the default
    procgroup-run --nproc-per-node 4 --backend gloo examples/demo.py
    mpiexec -n 4 python examples/demo.py --backend mpi
"""

from __future__ import annotations

import argparse

import numpy as np

import procgroup as pg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="tcp (default), mpi, gloo, ... ($PROCGROUP_BACKEND)")
    args = parser.parse_args()

    pg.init_process_group(args.backend, init_method=None if args.backend == "mpi" else "env://")
    rank, size = pg.get_rank(), pg.get_world_size()

    def say(what: str, value: object) -> None:
        print(f"rank {rank}/{size} [{pg.get_backend()}] {what:16s} {value}", flush=True)

    x = np.full(3, rank + 1, dtype=np.float32)
    pg.all_reduce(x)
    say("all_reduce SUM", x)

    m = np.array([rank * 10], dtype=np.int64)
    pg.all_reduce(m, op=pg.ReduceOp.MAX)
    say("all_reduce MAX", m)

    b = np.arange(4, dtype=np.int32) if rank == 0 else np.zeros(4, dtype=np.int32)
    pg.broadcast(b, src=0)
    say("broadcast from 0", b)

    gathered = [np.zeros(2, dtype=np.int32) for _ in range(size)]
    pg.all_gather(gathered, np.full(2, rank, dtype=np.int32))
    say("all_gather", [g.tolist() for g in gathered])

    out = np.zeros(1, dtype=np.float64)
    pg.reduce_scatter(out, [np.full(1, rank + j, dtype=np.float64) for j in range(size)])
    say("reduce_scatter", out)

    received = [np.zeros(1, dtype=np.int64) for _ in range(size)]
    pg.all_to_all(received, [np.array([rank * 100 + j]) for j in range(size)])
    say("all_to_all", [int(r[0]) for r in received])

    token = np.array([rank], dtype=np.int64)
    right, left = (rank + 1) % size, (rank - 1) % size
    work = pg.isend(token, right)
    got = np.zeros(1, dtype=np.int64)
    sender = pg.recv(got, src=left)
    work.wait()
    say("ring send/recv", f"got {int(got[0])} from rank {sender}")

    objs: list[object] = [None] * size
    pg.all_gather_object(objs, {"rank": rank, "hello": "world"[: rank + 1]})
    say("all_gather_object", objs)

    pg.barrier()
    if rank == 0:
        print(f"demo finished: {size} ranks on {pg.get_backend()}", flush=True)
    pg.destroy_process_group()


if __name__ == "__main__":
    main()
