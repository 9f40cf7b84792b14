"""What one GPU can check (scripts/gpu-check.sh runs it with the other GPU tests).

With a GPU (marked ``gpu``, skipped with the reason elsewhere): CuPy arrays between two
processes that share GPU 0, over tcp and gloo (the core stages them through host
memory), awaited from an event loop too; a 1-rank nccl communicator awaited from an
event loop; and two nccl ranks on one GPU refused with a clear error before NCCL is
called (NCCL itself would fail with "Duplicate GPU detected").

Everywhere: that refusal's rule, over a real Store from threads (GPU identities given,
no CUDA needed).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from typing import Any

import pytest
from _installed import gloo_engine_env

from procgroup import errors
from procgroup.testing import spawn

pytestmark = pytest.mark.timeout(300)


def _probe() -> str | None:
    """Why no GPU test can run here (None: a CUDA GPU with NCCL), asked of a fresh
    interpreter so this one never initializes CUDA before spawning ranks."""
    code = ("import json\ntry:\n from procgroup_nccl._availability import unavailable_reason\n"
            " r = unavailable_reason()\nexcept ImportError as e:\n r = f'procgroup-nccl is not importable: {e}'\n"
            "print(json.dumps(r))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return f"the GPU probe failed: {out.stderr.strip()[-300:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


REASON = _probe()


# ------------------------------------------------------------ the rule, without a GPU


def _threads(n: int, fn: Any) -> list[Any]:
    results: list[Any] = [None] * n

    def run(r: int) -> None:
        try:
            results[r] = fn(r)
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_ranks_sharing_a_gpu_are_refused_naming_them() -> None:
    from procgroup.rendezvous import HashStore
    from procgroup_nccl._comm import check_in_gpus, refuse_shared_gpus

    store = HashStore()
    gpus = ["hostA/boot|0000:17:00.0", "hostA/boot|0000:65:00.0", "hostA/boot|0000:17:00.0"]
    results = _threads(3, lambda r: refuse_shared_gpus(check_in_gpus(store, "c/in", r, 3, [gpus[r]], 10.0)))
    for res in results:
        assert isinstance(res, errors.InvalidArgumentError), res
        text = str(res)
        assert "ranks [0, 2]" in text and "0000:17:00.0" in text and "hostA" in text, text
        assert "one GPU per rank" in text and "tcp or gloo" in text, text
    # distinct GPUs (the same bus id on two hosts is two GPUs) pass
    store = HashStore()
    gpus = ["hostA/b|0000:17:00.0", "hostB/b|0000:17:00.0", "hostA/b|0000:65:00.0"]
    assert _threads(3, lambda r: refuse_shared_gpus(check_in_gpus(store, "d/in", r, 3, [gpus[r]], 10.0))) == [None] * 3
    # one process passing one GPU twice (*_multigpu) is refused too
    with pytest.raises(errors.InvalidArgumentError, match=r"ranks \[0, 0\]"):
        refuse_shared_gpus([["h|0000:17:00.0", "h|0000:17:00.0"]])


def test_gpus_without_a_bus_id_are_not_taken_for_one_gpu() -> None:
    """Two processes on one host whose CuPy gives no PCI bus id, each on its cuda:0 (under
    different CUDA_VISIBLE_DEVICES these are different GPUs): both pass the check."""
    from procgroup.rendezvous import HashStore
    from procgroup_nccl._comm import check_in_gpus, host_id, identity_of, refuse_shared_gpus

    code = "from procgroup_nccl._comm import identity_of; print(identity_of(None, 0))"
    gpus = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           check=True).stdout.strip() for _ in range(2)]
    assert gpus[0] != gpus[1] and all(g.startswith(host_id() + "|unknown GPU cuda:0 of pid ") for g in gpus), gpus
    store = HashStore()
    assert _threads(2, lambda r: refuse_shared_gpus(check_in_gpus(store, "u/in", r, 2, [gpus[r]], 10.0))) == [None] * 2
    # a known bus id is still compared across processes
    assert identity_of("0000:17:00.0", 0) == host_id() + "|0000:17:00.0"


# ------------------------------------------------------------ one GPU


def _cupy_between_processes(rank: int, size: int) -> dict[str, Any]:
    """Two processes on GPU 0: CuPy arrays through a CPU backend, blocking and awaited."""
    import cupy as cp

    import procgroup as pg

    out: dict[str, Any] = {}
    x = cp.full(1000, rank + 1, dtype=cp.float32)
    pg.all_reduce(x)
    out["all_reduce"] = float(x[0].get()), float(x[-1].get())
    b = cp.arange(5, dtype=cp.int64) * (rank + 1)
    pg.broadcast(b, src=1)
    out["broadcast"] = cp.asnumpy(b).tolist()
    got = cp.zeros(3, dtype=cp.float64)
    if rank == 0:
        pg.send(cp.arange(3, dtype=cp.float64) + 10, dst=1)
    else:
        out["recv_from"] = pg.recv(got, src=0)
    out["recv"] = cp.asnumpy(got).tolist()

    async def awaited() -> list[float]:
        ys = [cp.full(4, float(rank + k), dtype=cp.float64) for k in range(3)]
        await asyncio.gather(*(pg.all_reduce(y, async_op=True) for y in ys))
        return [float(y[0].get()) for y in ys]

    out["awaited"] = asyncio.run(awaited())
    return out


def _check_cupy(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        assert out["all_reduce"] == (3.0, 3.0), out
        assert out["broadcast"] == [0, 2, 4, 6, 8], out
        assert out["awaited"] == [1.0, 3.0, 5.0], out
        if rank == 1:
            assert out["recv"] == [10.0, 11.0, 12.0] and out["recv_from"] == 0, out


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
@pytest.mark.gpu
@pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA GPU: {REASON}")
def test_cupy_arrays_between_two_processes_sharing_the_gpu(backend: str) -> None:
    env = gloo_engine_env("torch") if backend == "gloo" else {}
    _check_cupy(spawn(_cupy_between_processes, 2, backend, timeout=120.0, job_timeout=240.0, env=env))


def _nccl_one_rank_awaited(rank: int, size: int) -> dict[str, Any]:
    import cupy as cp

    import procgroup as pg

    async def main() -> dict[str, Any]:
        xs = [cp.full(8, float(k + 1), dtype=cp.float32) for k in range(3)]
        done = await asyncio.gather(*(pg.all_reduce(x, async_op=True) for x in xs))
        b = cp.arange(4, dtype=cp.float32)
        await pg.broadcast(b, src=0, async_op=True)
        return {"done": list(done), "values": [float(x[0].get()) for x in xs], "b": cp.asnumpy(b).tolist()}

    return asyncio.run(main())


@pytest.mark.gpu
@pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA GPU: {REASON}")
def test_nccl_one_rank_awaited() -> None:
    (out,) = spawn(_nccl_one_rank_awaited, 1, "nccl", timeout=120.0, job_timeout=240.0)
    assert out == {"done": [True] * 3, "values": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 2.0, 3.0]}, out


def _two_nccl_ranks_one_gpu(rank: int, size: int) -> dict[str, Any]:
    import cupy as cp

    import procgroup as pg

    cp.cuda.Device(0).use()
    try:
        pg.all_reduce(cp.ones(4, dtype=cp.float32))
    except errors.InvalidArgumentError as exc:
        return {"error": str(exc)}
    return {"error": None}


@pytest.mark.gpu
@pytest.mark.skipif(REASON is not None, reason=f"needs a CUDA GPU: {REASON}")
def test_two_nccl_ranks_on_one_gpu_get_a_clear_error() -> None:
    results = spawn(_two_nccl_ranks_one_gpu, 2, "nccl", timeout=60.0, job_timeout=240.0)
    for out in results:
        assert out["error"] is not None and "ranks [0, 1]" in out["error"], out
        assert "same GPU" in out["error"], out

