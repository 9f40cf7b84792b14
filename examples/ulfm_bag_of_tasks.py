"""A master and workers with a bag of tasks; a worker dies holding one (ULFM's pattern).

Rank 0 hands out tasks one at a time and collects results with any-source receives.
A worker exits while it holds a task. The master's any-source receive fails, naming the
dead rank; the master acknowledges the failure (``failure_ack``, ULFM's
MPI_Comm_failure_ack), puts the dead worker's task back in the bag, and goes on
collecting from the live workers: no revoke, no shrink, and the live workers never
notice. A death touches only what involves the dead rank.

    procgroup-run --nproc-per-node 4 --keep-going examples/ulfm_bag_of_tasks.py
"""

from __future__ import annotations

import os
import time

import numpy as np
import procgroup as pg

TASK, RESULT = 1, 2  # tags
STOP = -1


def work(task: int) -> int:
    return task * task + 1


def master(tasks: int) -> dict[int, int]:
    """Hand out ``tasks`` tasks, collect their results; survive workers' deaths."""
    bag = list(range(tasks))
    results: dict[int, int] = {}
    held: dict[int, int] = {}  # worker -> the task it holds
    live = set(range(1, pg.get_world_size()))
    msg = np.zeros(2, dtype=np.int64)
    while len(results) < tasks:
        try:
            for w in sorted(live - held.keys()):  # every idle worker gets a task
                if bag:
                    held[w] = bag.pop()
                    pg.send(np.array([held[w]], dtype=np.int64), w, tag=TASK)
            src = pg.recv(msg, src=None, tag=RESULT)
            results[int(msg[0])] = int(msg[1])
            del held[src]
        except pg.PeerError:
            pg.failure_ack()  # any-source receives hear the live workers again
            for dead in pg.failure_get_acked():
                live.discard(dead)
                if dead in held:
                    bag.append(held.pop(dead))  # its task goes back in the bag
            if not live:
                raise
    for w in sorted(live):
        pg.send(np.array([STOP], dtype=np.int64), w, tag=TASK)
    return results


def worker(victim: bool, die_after: int) -> int:
    """Compute tasks until told to stop; the victim exits while it holds a task."""
    done = 0
    task = np.zeros(1, dtype=np.int64)
    while True:
        pg.recv(task, src=0, tag=TASK)
        if task[0] == STOP:
            return done
        if victim and done == die_after:
            time.sleep(0.2)  # what it sent has left the host
            os._exit(3)
        pg.send(np.array([task[0], work(int(task[0]))], dtype=np.int64), 0, tag=RESULT)
        done += 1


def run(rank: int, size: int, tasks: int = 40, victim: int = 2, die_after: int = 0) -> object:
    """The victim dies holding its first task: every worker gets one in the first round,
    so the death is certain to happen before the bag is empty."""
    if rank == 0:
        return master(tasks)
    return worker(rank == victim, die_after)


def main() -> None:
    pg.init_process_group("tcp")
    out = run(pg.get_rank(), pg.get_world_size())
    if isinstance(out, dict):
        wrong = [t for t, r in out.items() if r != work(t)]
        print(f"master: {len(out)} results, {len(wrong)} wrong, world now {pg.get_world_size()} ranks", flush=True)
    else:
        print(f"worker: computed {out} tasks", flush=True)
    pg.destroy_process_group()


if __name__ == "__main__":
    main()
