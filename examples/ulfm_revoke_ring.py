"""ULFM's revoke exercise in procgroup's words: a token ring that a death interrupts.

The ranks pass a counter around a ring, each adding one. Before the loop they split
off a *reporting group* of every rank but the victim (ULFM's tutorial makes it with
MPI_Comm_split). The victim exits mid-loop. The rank that finds out first (its
neighbour, whose send or receive fails) revokes the world, so the others, blocked in a
receive from a live neighbour, stop at once instead of waiting. Then every survivor
reports how far the token got over the reporting group: a death touches only what
involves the dead rank (ULFM's rule), so that group, which never held it, still works.

    procgroup-run --nproc-per-node 4 --keep-going examples/ulfm_revoke_ring.py --victim 2
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import procgroup as pg

ROUNDS = 50


def run(rank: int, size: int, victim: int = 2, die_at: int = 10) -> dict[str, object]:
    """One rank of the ring; returns what it saw (the victim never returns)."""
    reporters = pg.new_group([r for r in range(size) if r != victim])
    right, left = (rank + 1) % size, (rank - 1) % size
    token = np.zeros(1, dtype=np.int64)
    passes = 0
    try:
        for step in range(ROUNDS):
            if rank == victim and step == die_at:
                time.sleep(0.2)  # what it sent has left the host
                os._exit(3)
            if rank == 0:
                token[0] = step * size
                pg.send(token, right)
                pg.recv(token, left)
            else:
                pg.recv(token, left)
                token[0] += 1
                pg.send(token, right)
            passes += 1
        stopped = "finished"
    except pg.GroupRevokedError:
        stopped = "revoked"  # someone else found the death and revoked the world
    except pg.PeerError as exc:
        stopped = f"saw rank {exc.rank} die"
        pg.revoke()  # the others may wait on a live neighbour: stop them too
    # report over the group that never held the victim
    total = np.array([passes], dtype=np.int64)
    pg.all_reduce(total, group=reporters)
    return {"rank": rank, "passes": passes, "stopped": stopped, "all_passes": int(total[0]),
            "failed": list(pg.failed_ranks())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim", type=int, default=2)
    ap.add_argument("--die-at", type=int, default=10)
    args = ap.parse_args()
    pg.init_process_group("tcp")
    out = run(pg.get_rank(), pg.get_world_size(), args.victim, args.die_at)
    print(f"rank {out['rank']}: {out['stopped']} after {out['passes']} passes; "
          f"the survivors made {out['all_passes']} in all; failed ranks {out['failed']}", flush=True)
    pg.destroy_process_group()


if __name__ == "__main__":
    main()
