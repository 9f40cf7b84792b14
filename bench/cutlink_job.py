"""One rank of the cut-link job (tests/test_survive_cutlink.py, bench/chaos.py --cutlink).

Run on every host of a simulated cluster (procgroup.testing.simcluster, one rank per
host). Each rank runs all_reduce in a loop until one fails; meanwhile the caller cuts
one host's link. The survivors shrink and check an all_reduce in the new numbering; the
cut host, alone on its side, must fail its shrink (it is not a majority). Each rank
prints one line ``RESULT {json}`` with wall-clock times (the hosts share one clock), so
the caller computes detection and recovery times.

Environment: CUTLINK_DIR (a directory every host sees: ``ready-<rank>`` is written there
once the job runs), PROCGROUP_HEARTBEAT_TIMEOUT (set by the caller).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import procgroup as pg


def main() -> None:
    pg.init_process_group("tcp", timeout=120)
    rank, size = pg.get_rank(), pg.get_world_size()
    x = np.full(4, float(rank + 1))
    pg.all_reduce(x)
    assert x[0] == sum(range(1, size + 1)), x
    out: dict[str, object] = {"rank": rank}
    with open(os.path.join(os.environ["CUTLINK_DIR"], f"ready-{rank}"), "w") as f:
        f.write(str(os.getpid()))
    give_up = time.time() + 100
    try:
        while time.time() < give_up:
            y = np.ones(4)
            pg.all_reduce(y)
            time.sleep(0.005)
        raise SystemExit("no failure was seen within 100 s")
    except (pg.PeerError, pg.GroupRevokedError) as exc:
        out["detected_at"] = time.time()
        out["error"] = str(exc).splitlines()[0]
    out["failed_ranks"] = list(pg.failed_ranks())
    start = time.time()
    try:
        new = pg.shrink(timeout=60)
    except pg.PeerError as exc:  # the minority side
        out["role"] = "minority"
        out["shrink_error"] = str(exc)
        print("RESULT " + json.dumps(out), flush=True)
        os._exit(0)  # its peers are unreachable: no goodbyes to wait for
    out["role"] = "survivor"
    out["shrink_s"] = time.time() - start
    out["new_size"] = new.size
    z = np.full(4, float(pg.get_rank() + 1))
    pg.all_reduce(z)
    out["exact"] = bool(z[0] == sum(range(1, new.size + 1)))
    pg.barrier()
    print("RESULT " + json.dumps(out), flush=True)
    pg.destroy_process_group()


if __name__ == "__main__":
    main()
