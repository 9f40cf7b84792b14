"""Ranks that disagree on a collective: PROCGROUP_DEBUG=DETAIL on mpi, gloo and nccl.

Their transports cannot check, so with DETAIL every rank exchanges the op's fingerprint
before the collective: op vs op, size, dtype, root and reduce op mismatches become a
MismatchError on every rank, naming both ranks and both sides, and the group goes on.
Without DETAIL nothing is checked (the hang or abort that follows is not tested). Also:
object collectives refuse sizes a peer announces that are negative or over the limit.

tcp's socket path (PROCGROUP_TCP_SHM=0) checks the fingerprints its frames carry; the
gaps it used to have are rows here: a rank whose part only sends (a broadcast root, a
reduce leaf, gather's non-roots), a root disagreement in which every rank only sends, and
one in which every rank only receives (found by the probes of the waiting receives).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from _installed import gloo_engine_env, require_mpi

from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)

DETAIL = {"PROCGROUP_DEBUG": "detail"}


def _cases(rank: int, odd: int) -> list[tuple[str, Any]]:
    """(name, call) pairs; rank ``odd`` does something else than the others."""
    import procgroup as pg
    from procgroup.ops import ReduceOp

    me = rank == odd
    f32 = np.float32
    return [
        ("op", lambda: pg.all_reduce(np.ones(4, f32)) if not me else pg.broadcast(np.ones(4, f32), 0)),
        ("size", lambda: pg.all_reduce(np.ones(8 if me else 4, f32))),
        ("dtype", lambda: pg.all_reduce(np.ones(4, np.int32 if me else f32))),
        ("root", lambda: pg.broadcast(np.ones(4, f32), odd if me else 0)),
        ("reduce_op", lambda: pg.all_reduce(np.ones(4, f32), op=ReduceOp.MAX if me else ReduceOp.SUM)),
        ("reduce_root", lambda: pg.reduce(np.ones(4, f32), odd if me else 0)),
        ("gather_size", lambda: pg.gather(np.ones(2 if me else 3), [np.zeros(3) for _ in range(odd + 1)]
                                          if rank == 0 else None)),
        ("barrier_vs_all_gather", lambda: pg.barrier() if me else
         pg.all_gather([np.zeros(2) for _ in range(pg.get_world_size())], np.ones(2))),
        ("async", lambda: pg.all_reduce(np.ones(4 if me else 5), async_op=True).wait()),
    ]


def _matrix(rank: int, size: int) -> dict[str, Any]:
    """Every case, then a matching all_reduce: the group must still be usable."""
    import procgroup as pg
    from procgroup.errors import MismatchError

    odd = size - 1
    out: dict[str, Any] = {"checked": pg.group_channel()._agreement is not None}
    for name, call in _cases(rank, odd):
        try:
            call()
            out[name] = "no error"
        except MismatchError as exc:
            out[name] = (str(exc), list(exc.ranks))
        ok = np.full(3, rank + 1.0)
        pg.all_reduce(ok)
        out[f"{name}/after"] = float(ok[0])
    # a group of a group is checked too (its own tag window)
    sub = pg.new_group([0, odd])
    if rank in (0, odd):
        try:
            pg.all_reduce(np.ones(2 if rank == odd else 3), group=sub)
            out["group"] = "no error"
        except MismatchError as exc:
            out["group"] = (str(exc), list(exc.ranks))
        x = np.ones(2)
        pg.all_reduce(x, group=sub)
        out["group/after"] = float(x[0])
    pg.barrier()
    return out


def _check_matrix(results: list[dict[str, Any]]) -> None:
    size = len(results)
    odd = size - 1
    total = size * (size + 1) / 2
    for rank, out in enumerate(results):
        assert out["checked"] is True, out
        for name, _ in _cases(0, odd):
            got = out[name]
            assert got != "no error", (rank, name, got)
            msg, ranks = got
            # each rank names itself and the first rank that disagrees with it
            other = 0 if rank == odd else odd
            assert ranks == sorted({rank, other}), (rank, name, got)
            assert f"rank {rank} called" in msg and f"rank {other} called" in msg, (rank, name, msg)
            assert out[f"{name}/after"] == total, (rank, name, out)
        msgs = {name: out[name][0] for name, _ in _cases(0, odd)}
        assert "all_reduce" in msgs["op"] and "broadcast" in msgs["op"], msgs["op"]
        assert "16 bytes" in msgs["size"] and "32 bytes" in msgs["size"], msgs["size"]
        assert "int32" in msgs["dtype"] and "float32" in msgs["dtype"], msgs["dtype"]
        assert "root 0" in msgs["root"] and f"root {odd}" in msgs["root"], msgs["root"]
        assert "with SUM" in msgs["reduce_op"] and "with MAX" in msgs["reduce_op"], msgs["reduce_op"]
        assert "barrier" in msgs["barrier_vs_all_gather"] and "all_gather" in msgs["barrier_vs_all_gather"]
        if rank in (0, odd):
            msg, ranks = out["group"]
            assert ranks == [0, odd] and "16 bytes" in msg and "24 bytes" in msg, out["group"]
            assert out["group/after"] == 2.0


def _unchecked(rank: int, size: int) -> dict[str, Any]:
    """Without DETAIL (unset, OFF, INFO) no channel checks: matching calls just run."""
    import procgroup as pg

    arr = np.full(4, rank + 1.0)
    pg.all_reduce(arr)
    pg.broadcast(arr, 0)
    return {"checked": pg.group_channel()._agreement is not None, "sum": float(arr[0]),
            "level": os.environ.get("PROCGROUP_DEBUG")}


# ------------------------------------------------------------------ mpi
def test_mpi_mismatch_matrix() -> None:
    require_mpi()
    results = spawn(_matrix, 3, "mpi", launcher="mpiexec", init_method=None, env=DETAIL, timeout=30,
                    job_timeout=200)
    _check_matrix(results)


@pytest.mark.parametrize("level", [None, "off", "info"])
def test_mpi_without_detail_nothing_is_checked(level: str | None) -> None:
    require_mpi()
    env = {} if level is None else {"PROCGROUP_DEBUG": level}
    results = spawn(_unchecked, 2, "mpi", launcher="mpiexec", init_method=None, env=env, timeout=30)
    assert [r["checked"] for r in results] == [False, False]
    assert [r["sum"] for r in results] == [3.0, 3.0]


# ------------------------------------------------------------------ gloo
def _gloo_engine(name: str) -> dict[str, str]:
    """The environment that picks gloo engine ``name`` (skips only where it cannot install)."""
    return gloo_engine_env(name)


GLOO_ENGINES = pytest.mark.parametrize("engine", ["pygloo", "torch"])


@GLOO_ENGINES
def test_gloo_mismatch_matrix(engine: str) -> None:
    results = spawn(_matrix, 3, "gloo", env={**DETAIL, **_gloo_engine(engine)}, timeout=30, job_timeout=200)
    _check_matrix(results)


@GLOO_ENGINES
def test_gloo_without_detail_nothing_is_checked(engine: str) -> None:
    results = spawn(_unchecked, 2, "gloo", env=_gloo_engine(engine), timeout=30)
    assert [r["checked"] for r in results] == [False, False]


def _bad_level(rank: int, size: int) -> str:
    import procgroup as pg
    from procgroup.errors import InvalidArgumentError

    try:
        pg.init_process_group("gloo", os.environ["PG_URL"], rank=rank, world_size=size, timeout=30)
    except InvalidArgumentError as exc:
        return str(exc)
    pg.destroy_process_group()
    return "no error"


@GLOO_ENGINES
def test_bad_debug_level_is_an_error(tmp_path: Any, engine: str) -> None:
    (msg,) = spawn(_bad_level, 1, "gloo", init=False,
                   env={"PROCGROUP_DEBUG": "verbose", "PG_URL": f"file://{tmp_path}/rdv", **_gloo_engine(engine)})
    assert "PROCGROUP_DEBUG" in msg and "detail" in msg, msg


# ------------------------------------------------------------------ nccl
_GPUS = (
    "import json\n"
    "try:\n"
    "    from procgroup_nccl._availability import unavailable_reason, cuda_device_count\n"
    "    r = unavailable_reason(); n = cuda_device_count()[0] if r is None else 0\n"
    "except ImportError as exc:\n"
    "    r, n = f'procgroup-nccl is not importable: {exc}', 0\n"
    "print(json.dumps([r, n]))\n"
)


def _gpu_reason() -> str | None:
    """Why the nccl matrix cannot run here (asked in a fresh interpreter, so this one
    never initializes CUDA before spawning), or None."""
    import json

    out = subprocess.run([sys.executable, "-c", _GPUS], capture_output=True, text=True, timeout=120, check=True)
    reason, gpus = json.loads(out.stdout.strip().splitlines()[-1])
    if reason is not None:
        return f"needs CUDA GPUs with NCCL: {reason}"
    if gpus < 2:
        return f"needs 2 CUDA GPUs (found {gpus}): NCCL puts each rank on its own GPU"
    return None


def _nccl_matrix(rank: int, size: int) -> dict[str, Any]:
    import cupy as cp
    import procgroup as pg
    from procgroup.errors import MismatchError
    from procgroup.ops import ReduceOp

    cp.cuda.Device(rank).use()
    odd = size - 1
    me = rank == odd
    out: dict[str, Any] = {}
    cases = {
        "op": lambda: pg.all_reduce(cp.ones(4)) if not me else pg.broadcast(cp.ones(4), 0),
        "size": lambda: pg.all_reduce(cp.ones(8 if me else 4)),
        "dtype": lambda: pg.all_reduce(cp.ones(4, cp.int64 if me else cp.float64)),
        "root": lambda: pg.broadcast(cp.ones(4), odd if me else 0),
        "reduce_op": lambda: pg.all_reduce(cp.ones(4), op=ReduceOp.MAX if me else ReduceOp.SUM),
    }
    for name, call in cases.items():
        try:
            call()
            cp.cuda.runtime.deviceSynchronize()
            out[name] = "no error"
        except MismatchError as exc:
            out[name] = list(exc.ranks)
        ok = cp.full(3, rank + 1.0)
        pg.all_reduce(ok)
        out[f"{name}/after"] = float(ok[0].get())
    return out


def test_nccl_mismatch_matrix() -> None:
    reason = _gpu_reason()
    if reason is not None:
        pytest.skip(f"the nccl mismatch matrix runs on 2 CUDA GPUs: {reason}")
    results = spawn(_nccl_matrix, 2, "nccl", env=DETAIL, timeout=60, job_timeout=300)
    for out in results:
        for name in ("op", "size", "dtype", "root", "reduce_op"):
            assert out[name] == [0, 1], (name, out)
            assert out[f"{name}/after"] == 3.0, (name, out)


# ------------------------------------------------------------------ object collectives
def _forged_sizes(rank: int, size: int) -> dict[str, str]:
    """Rank 1 plays a member that announces forged pickle sizes; rank 0 calls the object
    collectives and must get a clear error, not a huge allocation."""
    import procgroup as pg
    from procgroup.errors import ProcGroupError

    out: dict[str, str] = {}
    for forged in (-5, 2**62):
        if rank == 0:
            got: list[Any] = [None] * size
            try:
                pg.all_gather_object(got, {"a": 1})
                out[f"all_gather/{forged}"] = "no error"
            except ProcGroupError as exc:
                out[f"all_gather/{forged}"] = f"{type(exc).__name__}: {exc}"
            objs: list[Any] = [None]
            try:
                pg.broadcast_object_list(objs, src=1)
                out[f"broadcast/{forged}"] = "no error"
            except ProcGroupError as exc:
                out[f"broadcast/{forged}"] = f"{type(exc).__name__}: {exc}"
        else:
            sizes = [np.zeros(1, dtype=np.int64) for _ in range(size)]
            pg.all_gather(sizes, np.array([forged], dtype=np.int64))
            pg.broadcast(np.array([forged], dtype=np.int64), 1)
        ok = np.ones(2)
        pg.all_reduce(ok)
        out[f"after/{forged}"] = str(ok[0])
    # honest objects still pass
    got2: list[Any] = [None] * size
    pg.all_gather_object(got2, {"rank": rank})
    out["honest"] = repr(got2)
    return out


def test_object_collectives_refuse_forged_sizes() -> None:
    (out, _) = spawn(_forged_sizes, 2, "tcp", timeout=30)
    for forged in (-5, 2**62):
        for op in ("all_gather", "broadcast"):
            msg = out[f"{op}/{forged}"]
            assert msg.startswith("PeerError") and "rank 1" in msg and str(forged) in msg, msg
        assert out[f"after/{forged}"] == "2.0"
    assert out["honest"] == repr([{"rank": 0}, {"rank": 1}])


# ------------------------------------------------------------------ tcp socket path
SOCKETS = {"PROCGROUP_TCP_SHM": "0"}


def _send_only_cases(rank: int, odd: int) -> list[tuple[str, Any]]:
    """Disagreements some ranks of which only send (``odd`` does something else)."""
    import procgroup as pg

    me = rank == odd
    n = 8 if me else 4
    size = odd + 1
    return [
        # the root only sends: only the receivers see the disagreement
        ("broadcast_root_sends", lambda: pg.broadcast(np.ones(n, np.float32), 0)),
        # the leaves of reduce only send
        ("reduce_leaves_send", lambda: pg.reduce(np.ones(n, np.float32), 0)),
        # gather's non-roots only send
        ("gather_non_roots_send", lambda: pg.gather(np.ones(n), [np.zeros(n) for _ in range(size)]
                                                    if rank == 0 else None, dst=0)),
        # two ranks both think they are the root: on 2 ranks nobody receives at all
        ("both_roots_send", lambda: pg.broadcast(np.ones(4, np.float32), odd if me else 0)),
        # one rank thinks it is the root of reduce: on 2 ranks every rank only receives (the
        # waiting receivers' probes find it)
        ("reduce_roots_receive", lambda: pg.reduce(np.ones(4, np.float32), odd if me else 0)),
        # one rank calls a collective the others skip: its k-th collective meets their k-th
        # (the same tag), here one that only sends against a barrier
        ("extra_collective", lambda: pg.broadcast(np.ones(4, np.float32), odd) if me else pg.barrier()),
    ]


def _socket_gaps(rank: int, size: int) -> dict[str, Any]:
    """Each case, then two all_to_all probes (a rank whose part only sent learns of the
    disagreement by the end of its next collective that hears from the rank that found
    it), then an exact all_reduce: the group must still be usable."""
    import procgroup as pg
    from procgroup.errors import MismatchError

    odd = size - 1
    out: dict[str, Any] = {}
    for name, call in _send_only_cases(rank, odd):
        errors: list[tuple[str, str, list[int]]] = []
        probes_ok = True
        for step in ("op", "probe1", "probe2"):
            inputs = [np.full(2, rank * 10.0 + j) for j in range(size)]
            outputs = [np.zeros(2) for _ in range(size)]
            try:
                if step == "op":
                    call()
                else:
                    pg.all_to_all(outputs, inputs)
            except MismatchError as exc:
                errors.append((step, str(exc), list(exc.ranks)))
            if step != "op":  # a probe that raises for an earlier collective has still run
                probes_ok &= all(float(outputs[j][0]) == j * 10.0 + rank for j in range(size))
        ok = np.full(3, rank + 1.0)
        pg.all_reduce(ok)
        out[name] = {"errors": errors, "probes_ok": probes_ok, "after": float(ok[0])}
    # a group of a group: its root only sends too (the sub-channels share one record)
    sub = pg.new_group([0, odd])
    if rank in (0, odd):
        errors = []
        for step in ("op", "probe1", "probe2"):
            try:
                if step == "op":
                    pg.broadcast(np.ones(8 if rank == odd else 4), 0, group=sub)
                else:
                    pg.all_to_all([np.zeros(1), np.zeros(1)], [np.ones(1), np.ones(1)], group=sub)
            except MismatchError as exc:
                errors.append((step, str(exc), list(exc.ranks)))
        x = np.ones(2)
        pg.all_reduce(x, group=sub)
        out["group"] = {"errors": errors, "after": float(x[0])}
    pg.barrier()
    return out


@pytest.mark.parametrize("size", [2, 3, 4])
def test_tcp_socket_path_send_only_ranks_raise(size: int) -> None:
    # the op timeout is beyond the job timeout: a hang fails the job, never a CommTimeoutError
    results = spawn(_socket_gaps, size, "tcp", env=SOCKETS, timeout=600, job_timeout=200)
    odd = size - 1
    total = size * (size + 1) / 2
    for rank, out in enumerate(results):
        for name, _ in _send_only_cases(0, odd):
            got = out[name]
            errors = got["errors"]
            assert len(errors) == 1, (rank, name, got)  # every rank, exactly once
            step, msg, ranks = errors[0]
            assert odd in ranks and len(ranks) == 2, (rank, name, got)
            assert f"rank {ranks[0]} called" in msg and f"rank {ranks[1]} called" in msg, (rank, name, msg)
            if step != "op":
                assert "an earlier collective" in msg, (rank, name, msg)
            assert got["probes_ok"] and got["after"] == total, (rank, name, got)
        if rank in (0, odd):
            errors = out["group"]["errors"]
            assert len(errors) == 1 and errors[0][2] == [0, odd], (rank, out["group"])
            assert "32 bytes" in errors[0][1] and "64 bytes" in errors[0][1], (rank, out["group"])
            assert out["group"]["after"] == 2.0, (rank, out["group"])
        sizes = out["broadcast_root_sends"]["errors"][0][1]
        assert "16 bytes" in sizes and "32 bytes" in sizes, sizes
        roots = out["both_roots_send"]["errors"][0][1]
        assert "root 0" in roots and f"root {odd}" in roots, roots
