"""Survivors go on with the nccl backend: abort the communicator, build a new one.

Needs 3 CUDA GPUs (NCCL puts each rank on its own GPU); skipped otherwise, with the
reason. The mechanism it exercises (a tcp side channel as the control plane, the
agreement, a new Store hosted by the lowest live rank) is tested on every machine by
tests/test_survive.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import procgroup as pg
import pytest
from procgroup.testing import spawn

_PROBE = (
    "import json; from procgroup_nccl._availability import unavailable_reason, cuda_device_count;"
    "r = unavailable_reason(); n = cuda_device_count()[0] if r is None else 0;"
    "print(json.dumps({'reason': r, 'gpus': n}))"
)


def _gpus() -> tuple[int, str]:
    """(GPUs, why not) from a fresh interpreter, so this one never initializes CUDA."""
    cached = os.environ.get("PROCGROUP_TEST_NCCL_PROBE")
    if not cached:
        try:
            out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                                 check=True)
        except (subprocess.SubprocessError, OSError) as exc:
            return 0, f"the nccl backend is not importable here ({exc})"
        cached = out.stdout.strip().splitlines()[-1]
        os.environ["PROCGROUP_TEST_NCCL_PROBE"] = cached
    probe = json.loads(cached)
    return int(probe["gpus"]), str(probe["reason"] or "")


GPUS, WHY = _gpus()


def nccl_rank_dies(rank: int, size: int) -> object:
    import cupy

    cupy.cuda.Device(rank).use()
    x = cupy.ones(16, dtype=cupy.float32)
    pg.all_reduce(x)
    cupy.cuda.Device(rank).synchronize()
    if rank == 1:
        os._exit(3)
    with pytest.raises((pg.PeerError, pg.GroupRevokedError, pg.CommTimeoutError)):
        pg.all_reduce(x)
        pg.barrier()
    assert 1 in pg.failed_ranks()
    pg.shrink(timeout=60)
    y = cupy.full(1000, float(rank + 1), dtype=cupy.float32)
    pg.all_reduce(y)
    assert float(y[0].get()) == 1.0 + 3.0
    b = cupy.full(8, float(pg.get_rank()), dtype=cupy.float32)
    pg.broadcast(b, src=1)
    assert np.all(b.get() == 1.0)
    return pg.get_rank(), pg.get_world_size()


@pytest.mark.skipif(GPUS < 3, reason=f"needs 3 CUDA GPUs (found {GPUS}) {WHY}".strip())
def test_nccl_survivors_abort_and_build_a_new_communicator() -> None:
    results = spawn(nccl_rank_dies, 3, "nccl", expect_dead=[1], timeout=60)
    assert [r for r in results if r is not None] == [(0, 2), (1, 2)]
