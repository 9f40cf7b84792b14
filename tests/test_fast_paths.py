"""The core's fast paths (send, recv and all_reduce of NumPy arrays skip the per-call
checks once a dtype has passed them): after the first call, every check still holds.

Each check runs a call twice, so the second goes through the fast path: ranks are
translated for sub-groups in any order, bad ranks, tags and arrays still get the same
clear errors, staged (non-NumPy) arrays still take the slow path, and a destroyed group
refuses the call. tcp and mpi (mpiexec), 3 ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import procgroup as pg
import pytest
from procgroup.errors import InvalidArgumentError, InvalidArrayError, NotInitializedError
from procgroup.testing import spawn


def _errors(call: Any) -> str:
    try:
        call()
    except (InvalidArgumentError, InvalidArrayError, NotInitializedError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _fast_paths(rank: int, size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # a sub-group in reverse order: group ranks differ from world ranks
    sub = pg.new_group([2, 0])
    for round_ in range(3):  # round 0 takes the slow path and teaches the dtype; 1, 2 the fast one
        a = np.full(4, rank * 10 + round_, dtype=np.float32)
        if rank == 0:
            pg.send(a, 1, tag=round_)
            got = np.empty(4, dtype=np.float32)
            out.setdefault("world_recv", []).append((pg.recv(got, None, tag=7), got.tolist()))
            sub_got = np.empty(4, dtype=np.float32)
            out.setdefault("sub_recv", []).append((pg.recv(sub_got, None, group=sub), sub_got.tolist()))
            pg.send(a, 2, group=sub, tag=round_)
        elif rank == 1:
            got = np.empty(4, dtype=np.float32)
            out.setdefault("world_recv", []).append((pg.recv(got, 0, tag=round_), got.tolist()))
            pg.send(a, 0, tag=7)
        else:
            pg.send(a, 0, group=sub)
            got = np.empty(4, dtype=np.float32)
            out.setdefault("sub_recv", []).append((pg.recv(got, 0, group=sub, tag=round_), got.tolist()))
        b = np.full(3, float(rank + 1))
        pg.all_reduce(b)
        out.setdefault("world_sum", []).append(b.tolist())
        if rank != 1:
            c = np.full(2, float(rank + 1))
            pg.all_reduce(c, group=sub, op=pg.ReduceOp.MAX)
            out.setdefault("sub_max", []).append(c.tolist())
    x = np.zeros(2, dtype=np.float32)
    out["self"] = _errors(lambda: pg.send(x, rank))
    out["outside"] = _errors(lambda: pg.send(x, 1, group=sub)) if rank != 1 else ""
    out["big_rank"] = _errors(lambda: pg.send(x, 99))
    out["bool_rank"] = _errors(lambda: pg.send(x, True))
    out["tag"] = _errors(lambda: pg.send(x, (rank + 1) % size, tag=-1))
    out["bool_tag"] = _errors(lambda: pg.recv(x, None, tag=True))
    out["read_only"] = _errors(lambda: pg.recv(np.frombuffer(b"\0" * 8, dtype=np.float32), None))
    out["strided"] = _errors(lambda: pg.recv(np.zeros(8, dtype=np.float32)[::2], None))
    if rank != 1:
        pg.destroy_process_group(sub)
        out["destroyed"] = _errors(lambda: pg.send(x, 2 - rank, group=sub))
    pg.barrier()
    return out


@pytest.mark.parametrize("backend", ["tcp", "mpi"])
def test_fast_paths_check_like_the_slow_ones(backend: str) -> None:
    if backend == "mpi":
        results = spawn(_fast_paths, 3, "mpi", launcher="mpiexec", init_method=None, timeout=60)
    else:
        results = spawn(_fast_paths, 3, backend, timeout=60)
    r0, r1, r2 = results
    for r in range(3):
        assert r0["world_recv"][r] == (1, [10.0 + r] * 4)  # world rank of the sender
        assert r1["world_recv"][r] == (0, [0.0 + r] * 4)
        assert r0["sub_recv"][r] == (2, [20.0 + r] * 4)  # sub-group: the sender's world rank
        assert r2["sub_recv"][r] == (0, [0.0 + r] * 4)
    for res in results:
        assert res["world_sum"] == [[6.0] * 3] * 3
        assert "is this process's own rank" in res["self"]
        assert "not a rank of this group" in res["big_rank"]
        assert "must be an int rank" in res["bool_rank"]
        assert "tag must be an int" in res["tag"] and "tag must be an int" in res["bool_tag"]
        assert res["read_only"].startswith("InvalidArrayError") and "read-only" in res["read_only"]
        assert res["strided"].startswith("InvalidArrayError")
    for res in (r0, r2):
        assert res["sub_max"] == [[3.0, 3.0]] * 3
        assert "not a rank of this group" in res["outside"]
        assert res["destroyed"].startswith("NotInitializedError") and "destroyed" in res["destroyed"]
