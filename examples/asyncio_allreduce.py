"""All-reduce from inside an asyncio event loop: the loop keeps serving while ops wait.

Each rank starts several all-reduces with ``async_op=True`` and awaits them together with
``asyncio.gather``; a heartbeat task runs beside them and counts how often it ran while
the ops waited (rank 0 joins late on purpose, so the others have to wait).

    procgroup-run --nproc-per-node 4 examples/asyncio_allreduce.py
    procgroup-run --nproc-per-node 4 --backend gloo examples/asyncio_allreduce.py
    mpiexec -n 4 python examples/asyncio_allreduce.py --backend mpi
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import procgroup as pg


async def heartbeat(beats: list[int]) -> None:
    while True:
        await asyncio.sleep(0.005)
        beats[0] += 1


async def main(backend: str | None) -> None:
    pg.init_process_group(backend, init_method=None if backend == "mpi" else "env://")
    rank, size = pg.get_rank(), pg.get_world_size()
    beats = [0]
    task = asyncio.create_task(heartbeat(beats))
    try:
        grads = [np.full(4, float(rank + k), dtype=np.float32) for k in range(3)]
        if rank == 0:
            time.sleep(0.3)  # a slow rank: the others' awaits wait for it, their loops do not
        works = [pg.all_reduce(g, op=pg.ReduceOp.SUM, async_op=True) for g in grads]
        await asyncio.gather(*works)
        expect = [sum(r + k for r in range(size)) for k in range(3)]
        assert [float(g[0]) for g in grads] == expect, grads
        # a receive awaited: the message, and the sender it came from
        buf = np.empty(1)
        peer_from, peer_to = (rank - 1) % size, (rank + 1) % size
        send = pg.isend(np.array([float(rank)]), dst=peer_to)
        recv = pg.irecv(buf, src=peer_from)
        await asyncio.gather(send, recv)
        print(f"rank {rank}/{size} [{pg.get_backend()}] sums {expect}, got {buf[0]:g} from rank "
              f"{recv.source_rank()}, heartbeats while waiting: {beats[0]}", flush=True)
    finally:
        task.cancel()
        pg.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="tcp (default), mpi, gloo, ... ($PROCGROUP_BACKEND)")
    asyncio.run(main(parser.parse_args().backend))
