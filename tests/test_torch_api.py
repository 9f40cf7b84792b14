"""torch.distributed's API on procgroup (issue 27), checked on real ranks.

One 4-rank job per (backend, array kind) runs every check in order: torch's parameter
names and procgroup's aliases, group_src/group_dst, the non-member rule, int groups, the
2017 halves of gather/scatter, the single-tensor collectives, batch_isend_irecv,
monitored_barrier naming the missing rank, object p2p and weights_only, subgroups and
rank translations, and torch tensors moved in place. The signatures are compared with
the installed torch's, in-process.
"""

from __future__ import annotations

import collections
import inspect
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _installed import require_mpi, why_no_gloo_engine
from procgroup.testing import spawn

ROOT = Path(__file__).resolve().parents[1]
SIZE = 4
HAVE_TORCH = why_no_gloo_engine("torch") is None


def _arr(kind: str, values: Any, dtype: str = "float32") -> Any:
    a = np.array(values, dtype=dtype)
    if kind == "torch":
        import torch

        return torch.from_numpy(a)
    return a


def _np(x: Any) -> np.ndarray:
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def _raises(exc: type[BaseException], fn: Any, *words: str) -> str:
    try:
        fn()
    except exc as err:
        for w in words:
            assert w in str(err), f"{w!r} not in {err!r}"
        return str(err)
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


# ------------------------------------------------------------------ the rank's checks
def _checks(rank: int, size: int, kind: str) -> dict[str, Any]:
    import procgroup as dist

    _names(dist, rank, kind)
    _non_member(dist, rank, kind)
    _halves_2017(dist, rank, kind)
    _single_tensor(dist, rank, size, kind)
    _batch_p2p(dist, rank, size, kind)
    _monitored(dist, rank)
    _objects(dist, rank)
    _subgroups(dist, rank, size)
    if kind == "torch":
        _torch_specifics(dist, rank)
    dist.barrier(timeout=30)
    _tutorial_examples(rank, size, kind)
    return {"torch_loaded": "torch" in sys.modules}


def _tutorial_examples(rank: int, size: int, kind: str) -> None:
    """examples/tutorial_*.py's run(rank, size), in this job's group."""
    sys.path.insert(0, str(ROOT / "examples"))
    import tutorial_common

    tutorial_common.ARRAYS = kind
    for name in ("tutorial_p2p", "tutorial_groups", "tutorial_ring_allreduce", "tutorial_sgd"):
        __import__(name).run(rank, size)
        __import__("procgroup").barrier()


def _names(dist: Any, rank: int, kind: str) -> None:
    t = _arr(kind, [rank] * 3)
    if rank == 0:
        dist.send(tensor=_arr(kind, [7.0, 8, 9]), dst=1)  # the tutorial's spelling
        dist.send(array=_arr(kind, [1.0, 2, 3]), dst=1)  # procgroup's older one
        _raises(TypeError, lambda: dist.send(_arr(kind, [0.0]), 1, array=t), "'tensor'", "'array'")
        _raises(TypeError, lambda: dist.send(tensor=t, array=t, dst=1), "'tensor'", "'array'")
        _raises(TypeError, lambda: dist.send(t, dst=1, destination=2), "destination", "group_dst", "array")
    elif rank == 1:
        assert dist.recv(tensor=t, src=0) == 0 and _np(t).tolist() == [7, 8, 9]
        assert dist.recv(array=t, group_src=0) == 0 and _np(t).tolist() == [1, 2, 3]
    evens = dist.new_group([0, 2])
    if rank in (0, 2):  # group_src is a rank in the group: 1 is world rank 2
        b = _arr(kind, [rank] * 2)
        dist.broadcast(b, group_src=1, group=evens)
        assert _np(b).tolist() == [2, 2]
        _raises(dist.InvalidArgumentError, lambda: dist.broadcast(b, src=2, group_src=1, group=evens), "not both")
    r = _arr(kind, [1.0])
    dist.all_reduce(tensor=r, op=dist.ReduceOp.SUM, group=0)  # the 2017 int group: 0 is the world
    assert _np(r)[0] == SIZE
    g = _arr(kind, [rank], "int64")
    outs = [_arr(kind, [-1], "int64") for _ in range(SIZE)] if rank == 3 else None
    dist.gather(g, gather_list=outs, group_dst=3)
    if outs is not None:
        assert [int(_np(o)[0]) for o in outs] == list(range(SIZE))
    ins = [_arr(kind, [10 * i], "int64") for i in range(SIZE)]
    dist.all_to_all(output_tensor_list=[_arr(kind, [0], "int64") for _ in range(SIZE)], input_tensor_list=ins)


def _non_member(dist: Any, rank: int, kind: str) -> None:
    """The tutorial's group [0, 1] on 4 ranks: ranks 2, 3 call the collective too."""
    group = dist.new_group([0, 1])
    tensor = _arr(kind, [1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        again = dist.all_reduce(tensor, group=group, async_op=True)
    assert out is None
    if rank < 2:
        again.wait()
        assert _np(tensor)[0] == 4.0 and not caught
    else:
        assert _np(tensor)[0] == 1.0 and again is None
        assert len([w for w in caught if "does not belong" in str(w.message)]) <= 1
        assert dist.recv(tensor, src=0, group=group) == -1
    dist.barrier()


def _halves_2017(dist: Any, rank: int, kind: str) -> None:
    mine = _arr(kind, [rank * 1.5])
    if rank == 1:
        got = [_arr(kind, [-1.0]) for _ in range(SIZE)]
        dist.gather_recv(got, mine)
        assert [float(_np(x)[0]) for x in got] == [r * 1.5 for r in range(SIZE)]
        pieces = [_arr(kind, [100.0 + r]) for r in range(SIZE)]
        dist.scatter_send(pieces, mine)
    else:
        dist.gather_send(mine, 1)
        dist.scatter_recv(mine, 1)
    assert _np(mine)[0] == 100.0 + rank


def _single_tensor(dist: Any, rank: int, size: int, kind: str) -> None:
    out = _arr(kind, np.zeros((size, 2)))
    dist.all_gather_into_tensor(out, _arr(kind, [rank, rank + 0.5]))
    assert _np(out).tolist() == [[r, r + 0.5] for r in range(size)]
    flat = _arr(kind, np.zeros(size * 2))
    dist.all_gather_into_tensor(flat, _arr(kind, [rank, rank]), async_op=True).wait()
    assert _np(flat).tolist() == [float(r) for r in range(size) for _ in (0, 1)]
    mine = _arr(kind, [0.0, 0.0])
    dist.reduce_scatter_tensor(mine, _arr(kind, np.arange(size * 2) + rank))
    assert _np(mine).tolist() == [4 * (2 * rank) + 6, 4 * (2 * rank + 1) + 6]
    # equal splits: row j of input goes to rank j
    a2a_out = _arr(kind, np.zeros(size), "int64")
    dist.all_to_all_single(a2a_out, _arr(kind, [10 * rank + j for j in range(size)], "int64"))
    assert _np(a2a_out).tolist() == [10 * j + rank for j in range(size)]
    # uneven: rank r sends r+1 rows of 2 to every rank, each row filled with r
    ins = _arr(kind, np.full(((rank + 1) * size, 2), rank), "int32")
    takes = [j + 1 for j in range(size)]
    outs = _arr(kind, np.zeros((sum(takes), 2)), "int32")
    dist.all_to_all_single(outs, ins, output_split_sizes=takes, input_split_sizes=[rank + 1] * size)
    assert _np(outs)[:, 0].tolist() == [j for j in range(size) for _ in range(j + 1)]
    _raises(dist.InvalidArgumentError, lambda: dist.all_to_all_single(outs, ins, input_split_sizes=[0] * size),
            "input_split_sizes")


def _batch_p2p(dist: Any, rank: int, size: int, kind: str) -> None:
    """The ring exchange both ways, in one batch."""
    right, left = (rank + 1) % size, (rank - 1) % size
    from_left, from_right = _arr(kind, [-1.0]), _arr(kind, [-1.0])
    ops = [dist.P2POp(dist.isend, _arr(kind, [float(rank)]), right), dist.P2POp(dist.irecv, from_left, left),
           dist.P2POp(dist.isend, _arr(kind, [float(rank)]), left), dist.P2POp(dist.irecv, from_right, right)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert _np(from_left)[0] == left and _np(from_right)[0] == right
    _raises(dist.InvalidArgumentError, lambda: dist.P2POp(dist.all_reduce, from_left, 1), "isend")


def _monitored(dist: Any, rank: int) -> None:
    dist.monitored_barrier(timeout=30)
    if rank != 3:  # rank 3 stays away: everyone else hears that rank 3 (exactly) is missing
        for wait_all in (True, False):
            _raises(dist.CommTimeoutError, lambda w=wait_all: dist.monitored_barrier(timeout=1, wait_all_ranks=w),
                    "rank(s) [3] did not")
    dist.barrier()


def _objects(dist: Any, rank: int) -> None:
    if rank == 0:
        dist.send_object_list([{"a": 1}, np.arange(3), "s"], dst=2)
        dist.send_object_list([collections.Counter("aab")], group_dst=2)
    elif rank == 2:
        got: list[Any] = [None] * 3
        assert dist.recv_object_list(got, weights_only=True) == 0
        assert got[0] == {"a": 1} and got[1].tolist() == [0, 1, 2] and got[2] == "s"
        one: list[Any] = [None]
        _raises(dist.PeerError, lambda: dist.recv_object_list(one, src=0, weights_only=True), "rank 0",
                "collections.Counter")
    objs: list[Any] = [None, None]
    if rank == 1:
        objs = [{"lr": 0.1, "w": np.ones(2, dtype=np.float32)}, (1, 2.5, b"x")]
    dist.broadcast_object_list(objs, src=1, device="cpu", weights_only=True)
    assert objs[1] == (1, 2.5, b"x") and objs[0]["w"].dtype == np.float32
    gathered: list[Any] = [None] * SIZE
    dist.all_gather_object(gathered, {"rank": rank}, weights_only=True)
    assert gathered == [{"rank": r} for r in range(SIZE)]
    everywhere: list[Any] = [None] * SIZE
    if rank == 3:
        dist.all_gather_object(everywhere, print)  # a function: refused where weights_only is asked
    else:
        _raises(dist.PeerError, lambda: dist.all_gather_object(everywhere, rank, weights_only=True),
                "rank 3", "builtins.print")
    dist.barrier()


def _subgroups(dist: Any, rank: int, size: int) -> None:
    mine, pairs = dist.new_subgroups(2)
    assert len(pairs) == 2 and dist.get_process_group_ranks(mine) == [rank - rank % 2, rank - rank % 2 + 1]
    assert dist.get_global_rank(pairs[1], 0) == 2 and dist.get_group_rank(pairs[1], 3) == 1
    _raises(dist.InvalidArgumentError, lambda: dist.get_group_rank(pairs[1], 0), "not a rank")
    t = np.array([1.0])
    dist.all_reduce(t, group=mine)
    assert t[0] == 2.0
    sub, subs = dist.new_subgroups_by_enumeration([[3, 0], [1]])
    assert (sub is None) == (rank == 2) and len(subs) == 2
    back = dist.new_group([3, 1], sort_ranks=False)
    if rank in (1, 3):
        assert dist.get_rank(back) == (0 if rank == 3 else 1) and dist.get_process_group_ranks(back) == [3, 1]
    assert dist.get_node_local_rank(fallback_rank=rank) in (rank, int(__import__("os").environ.get("LOCAL_RANK", -1)))
    assert isinstance(dist.is_torchelastic_launched(), bool)


def _torch_specifics(dist: Any, rank: int) -> None:
    import torch

    w = torch.ones(3, requires_grad=True)  # a parameter: written in place through detach()
    dist.all_reduce(w)
    assert w.tolist() == [4.0] * 3
    bad = torch.zeros(4, 4).t()
    _raises(dist.InvalidArrayError, lambda: dist.all_reduce(bad), "non-contiguous")
    _raises(dist.InvalidArrayError, lambda: dist.broadcast(torch.zeros(2, dtype=torch.bfloat16), 0),
            "bfloat16")
    _raises(dist.InvalidArrayError, lambda: dist.all_reduce(torch.zeros(2, device="meta")), "meta")
    buf = torch.zeros(5, dtype=torch.int64)
    ptr = buf.data_ptr()
    if rank == 0:
        dist.send(torch.arange(5), 3)
    elif rank == 3:
        dist.recv(buf, 0)
        assert buf.tolist() == list(range(5)) and buf.data_ptr() == ptr


# ------------------------------------------------------------------ the jobs
def _job(backend: str, kind: str, **kw: Any) -> list[Any]:
    if kind == "torch" and not HAVE_TORCH:
        pytest.skip(f"torch: {why_no_gloo_engine('torch')}")
    return spawn(_checks, SIZE, backend, args=(kind,), timeout=60, job_timeout=300, **kw)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_api_tcp(kind: str) -> None:
    results = _job("tcp", kind)
    if kind == "numpy":  # torch is loaded only by a caller that passes tensors
        assert not any(r["torch_loaded"] for r in results), results


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_api_mpi(kind: str) -> None:
    require_mpi()
    _job("mpi", kind, launcher="mpiexec", init_method=None)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_api_gloo(kind: str) -> None:
    engine = "pygloo" if why_no_gloo_engine("pygloo") is None else "torch"
    if why_no_gloo_engine(engine) is not None:
        pytest.skip(f"no gloo engine: {why_no_gloo_engine(engine)}")
    _job("gloo", kind, init_method="tcp", env={"PROCGROUP_GLOO_ENGINE": engine})


# ------------------------------------------------------------------ signatures (in-process)
@pytest.mark.skipif(not HAVE_TORCH, reason="torch was left out (PROCGROUP_DEV_TORCH=0)")
def test_signatures_match_torch() -> None:
    """Every function procgroup shares with torch.distributed takes torch's parameters:
    the same names, kinds, order and defaults (procgroup may add keyword-only ones)."""
    import procgroup
    from procgroup._torch_compat import compare, shared_functions

    mismatched = {name: why for name in shared_functions() if (why := compare(name)) is not None}
    assert not mismatched, mismatched
    assert len(shared_functions()) >= 38
    assert "send" in shared_functions() and inspect.signature(procgroup.send).parameters["tensor"]


def test_tutorial_example_standalone() -> None:
    """An example started as its docstring says: it starts its own ranks."""
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "tutorial_p2p.py"), "-n", "2"],
                          capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Rank  1  has data  1.0" in proc.stdout


def test_from_torch_page_is_generated() -> None:
    """docs/from-torch.md is what `python -m procgroup torch-compat --markdown` prints."""
    if not HAVE_TORCH:  # only where the setup left torch out (PROCGROUP_DEV_TORCH=0)
        pytest.skip(f"the page compares with torch: {why_no_gloo_engine('torch')}")
    out = subprocess.run([sys.executable, "-m", "procgroup", "torch-compat", "--markdown"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    page = (ROOT / "docs" / "from-torch.md").read_text()
    assert out == page, "docs/from-torch.md is stale: python -m procgroup torch-compat --markdown > docs/from-torch.md"


def test_names_in_process() -> None:
    """Alias errors and signatures need no ranks."""
    import procgroup as dist

    msg = _raises(TypeError, lambda: dist.send(np.zeros(1), dst=1, frobnicate=1), "frobnicate", "tensor", "array")
    assert "group_dst" in msg
    _raises(TypeError, lambda: dist.all_gather([np.zeros(1)], np.zeros(1), array_list=[]), "'tensor_list'",
            "'array_list'")
    assert list(inspect.signature(dist.all_to_all).parameters)[:2] == ["output_tensor_list", "input_tensor_list"]


@pytest.mark.parametrize("protocol", [2, 5])
def test_weights_only_unpickler_in_process(protocol: int) -> None:
    """What weights_only=True builds, and what it refuses (naming it), under old and new pickle protocols."""
    import pickle

    from procgroup._safe_pickle import loads

    plain = [{"a": [1, 2.5, 3j, "s", b"b", None, True]}, (1, {2, 3}, frozenset([4])), np.arange(6.0).reshape(2, 3),
             np.float32(3), np.dtype("int16"), collections.OrderedDict(a=1), np.array(["ab", "c"]), bytearray(b"x"),
             range(4)]
    for obj in plain:
        assert repr(loads(pickle.dumps(obj, protocol=protocol), True)) == repr(obj)
    refused = {"collections.Counter": collections.Counter("ab"), "builtins.print": print,
               "Python objects": np.array([1, "a"], dtype=object)}
    for what, obj in refused.items():
        _raises(pickle.UnpicklingError, lambda o=obj: loads(pickle.dumps(o, protocol=protocol), True), what)
    assert loads(pickle.dumps(collections.Counter("ab"), protocol=protocol), False) == collections.Counter("ab")
