"""Shrink until one is left (ULFM's shrink pattern), in procgroup's words.

Each round one rank of the current world exits (rank 0 among them: no rank is special),
the others find out in a barrier, ``shrink`` the world to the survivors, check an
all_reduce in the new numbering, and go on, until one rank is left.

    procgroup-run --nproc-per-node 4 --keep-going examples/ulfm_shrink_until_one.py
"""

from __future__ import annotations

import os
import time

import numpy as np
import procgroup as pg


def victim_of(round_no: int, size: int) -> int:
    """Who dies in round ``round_no`` of a world of ``size``: rank 0 first, then others."""
    return (round_no * 2) % size


def run(rank: int, size: int) -> dict[str, object]:
    """Returns the survivor's story (every other rank exits along the way)."""
    orig = rank
    sizes = [size]
    round_no = 0
    while pg.get_world_size() > 1:
        n, me = pg.get_world_size(), pg.get_rank()
        if me == victim_of(round_no, n):
            time.sleep(0.2)  # what it sent has left the host
            os._exit(3)
        try:
            pg.barrier()
            raise AssertionError("the barrier completed without the victim")
        except (pg.PeerError, pg.GroupRevokedError):
            pass
        pg.shrink()
        x = np.full(4, 1.0)
        pg.all_reduce(x)  # every survivor, in the new numbering
        assert x[0] == n - 1, (x, n)
        sizes.append(pg.get_world_size())
        round_no += 1
    return {"orig": orig, "sizes": sizes}


def main() -> None:
    pg.init_process_group("tcp")
    out = run(pg.get_rank(), pg.get_world_size())
    print(f"rank {out['orig']} is the last one; world sizes {out['sizes']}", flush=True)
    pg.destroy_process_group()


if __name__ == "__main__":
    main()
