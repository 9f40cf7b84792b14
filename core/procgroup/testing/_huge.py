"""Messages over 2 GiB: 64-bit lengths and counts on every path, for any backend."""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def skip_unless_memory(nbytes: int) -> None:
    """Skip the calling test, with the reason, when less than ``nbytes`` of RAM is free."""
    import pytest

    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        avail = 0
    if avail < nbytes:
        pytest.skip(f"needs ~{nbytes / 2**30:.0f} GiB free memory, {avail / 2**30:.1f} GiB available")


def over_2gib(rank: int, size: int, nbytes: int) -> dict[str, Any]:
    """Counts over INT_MAX: broadcast, send/recv and all_reduce of > 2 GiB of uint8."""
    import procgroup as pg

    buf = np.empty(nbytes, dtype=np.uint8)
    buf[:] = 3 if rank == 0 else 0
    buf[-1] = 9 if rank == 0 else 0
    pg.broadcast(buf, 0)
    out = {"bcast": bool(buf[0] == 3 and buf[-1] == 9 and buf[nbytes // 2] == 3)}
    if rank == 1:
        buf[:] = 0
        pg.recv(buf, 0)
    elif rank == 0:
        buf[-1] = 11
        pg.send(buf, 1)
    out["p2p"] = bool(buf[0] == 3 and buf[-1] == 11 and buf[nbytes // 3] == 3)
    pg.all_reduce(buf, op=pg.ReduceOp.MAX)
    out["max"] = bool(buf[0] == 3 and buf[-1] == 11)
    return out
