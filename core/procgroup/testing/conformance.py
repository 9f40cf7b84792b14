"""The conformance suite every DataChannel proves itself with.

A backend's test module subclasses :class:`ConformanceSuite`::

    from procgroup.testing import ConformanceSuite

    class TestMyBackend(ConformanceSuite):
        backend = "mine"
        world_sizes = (1, 2, 3, 4)

Per world size one job of real processes runs every check (so the suite stays fast on
small machines); each check is then reported as its own pytest test, failing with the
traceback of every rank where it failed. Failure behaviour (a rank killed in the middle
of a collective, a collective nobody joins) runs in jobs of its own.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, ClassVar
from collections.abc import Callable

import pytest

from . import _checks
from ._spawn import WorkerError, spawn


def _run_suite(rank: int, size: int, opts: dict[str, Any], names: list[str]) -> dict[str, str | None]:
    from procgroup.plugins import get_backend_spec

    import procgroup as pg

    ch = pg.group_channel()  # which devices it takes directly
    opts = dict(opts, devices=getattr(ch, "devices", None) or get_backend_spec(opts["backend"]).devices)
    return _checks.run_all(rank, size, opts, names)


def _die_mid_collective(rank: int, size: int, victim: int) -> dict[str, Any]:
    """The victim exits abruptly inside a stream of all_reduces; survivors must raise."""
    import numpy as np

    import procgroup as pg
    from procgroup.errors import ProcGroupError

    arr = np.ones(1 << 16, dtype=np.float32)
    start = time.monotonic()
    try:
        for i in range(1000):
            if rank == victim and i == 3:
                os._exit(17)
            pg.all_reduce(arr)
    except ProcGroupError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    return {"error": None, "message": "", "seconds": time.monotonic() - start}


def _close_fails_pending(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 starts a receive nobody answers and a collective nobody joins, then closes the
    group: both Works must fail with a ProcGroupError at once, not wait out the timeout."""
    import numpy as np

    import procgroup as pg
    from procgroup.errors import ProcGroupError

    out: dict[str, Any] = {}
    if rank == 0:
        recv = _checks.started(pg.irecv(np.zeros(4), src=1, tag=4242))
        coll = _checks.started(pg.all_reduce(np.ones(4), async_op=True))
        assert coll is not None
        start = time.monotonic()
        pg.destroy_process_group()
        for name, work in (("irecv", recv), ("all_reduce", coll)):
            try:
                work.wait()
                out[name] = {"error": None, "message": "completed"}
            except ProcGroupError as exc:
                out[name] = {"error": type(exc).__name__, "message": str(exc)}
            except Exception as exc:  # noqa: BLE001 - reported as a failure of the check
                out[name] = {"error": f"not a ProcGroupError: {type(exc).__name__}", "message": str(exc)}
        out["seconds"] = time.monotonic() - start
    else:
        time.sleep(1.0)
    return out


def _nobody_joins(rank: int, size: int) -> dict[str, Any]:
    """Rank 0 calls all_reduce alone; it must time out and name the ranks it waited for."""
    import numpy as np

    import procgroup as pg
    from procgroup.errors import CommTimeoutError

    result: dict[str, Any] = {"error": None, "message": ""}
    if rank == 0:
        try:
            pg.all_reduce(np.ones(4))
        except CommTimeoutError as exc:
            result = {"error": type(exc).__name__, "message": str(exc)}
    else:
        time.sleep(4.0)
    return result


class ConformanceSuite:
    """Subclass with ``backend = "<name>"``; override the class attributes as needed."""

    backend: ClassVar[str] = ""
    world_sizes: ClassVar[tuple[int, ...]] = (1, 2, 3, 4)
    launcher: ClassVar[str] = "process"  # or "mpiexec"
    init_method: ClassVar[str | None] = "file"  # None: the backend finds its peers
    timeout: ClassVar[float] = 60.0
    #: Called in every rank before init (e.g. register_backend for a runtime backend).
    setup: ClassVar[Callable[[], None] | None] = None
    #: Checks this backend is known not to support, with the reason (reported as skips);
    #: also "peer_death_raises_on_survivors" and "close_fails_pending_work".
    unsupported: ClassVar[dict[str, str]] = {}
    #: Whether a dead peer makes survivors raise (MPI aborts the whole job instead). When
    #: they do, the error must be a PeerError naming the dead rank.
    survivors_raise: ClassVar[bool] = True
    #: Environment of every rank (e.g. a backend switch such as PROCGROUP_TCP_SHM=0).
    env: ClassVar[dict[str, str]] = {}

    @pytest.fixture(scope="class")
    @classmethod
    def suite_results(cls) -> dict[int, list[dict[str, str | None]]]:
        names = [n for n in _checks.CHECKS if n not in cls.unsupported]
        out = {}
        for size in cls.world_sizes:
            with tempfile.TemporaryDirectory(prefix="procgroup-suite-") as tmp:
                opts = {"backend": cls.backend, "tmpdir": tmp}
                out[size] = cls._spawn(_run_suite, size, args=(opts, names))
        return out

    @classmethod
    def _spawn(cls, fn: Callable[..., Any], size: int, **kw: Any) -> list[Any]:
        # a plain function stored on the class would become a method: read it raw
        setup = next((c.__dict__["setup"] for c in cls.__mro__ if c.__dict__.get("setup")), None)
        if isinstance(setup, staticmethod):
            setup = setup.__func__
        kw.setdefault("timeout", cls.timeout)
        kw.setdefault("env", dict(cls.env))
        return spawn(fn, size, cls.backend, launcher=cls.launcher, init_method=cls.init_method,
                     setup=setup, **kw)

    @staticmethod
    def _report(results: dict[int, list[dict[str, str | None]]], name: str) -> None:
        failures = [
            f"world size {size}, rank {rank}:\n{per_rank[name]}"
            for size, ranks in results.items()
            for rank, per_rank in enumerate(ranks)
            if per_rank.get(name)
        ]
        if failures:
            raise AssertionError(f"check {name!r} failed:\n" + "\n".join(failures))

    # -------------------------------------------------------------- failure behaviour
    @pytest.mark.parametrize("size", [2, 3])
    def test_peer_death_raises_on_survivors(self, size: int) -> None:
        if size not in self.world_sizes:
            pytest.skip(f"world size {size} not in this backend's world_sizes {self.world_sizes}")
        if "peer_death_raises_on_survivors" in self.unsupported:
            pytest.skip(f"{self.backend}: {self.unsupported['peer_death_raises_on_survivors']}")
        victim = size - 1
        if not self.survivors_raise:
            with pytest.raises(WorkerError):
                self._spawn(_die_mid_collective, size, args=(victim,), timeout=20.0, job_timeout=90.0)
            return
        results = self._spawn(_die_mid_collective, size, args=(victim,), timeout=20.0,
                              expect_dead=[victim], job_timeout=90.0)
        for rank, res in enumerate(results):
            if rank == victim:
                continue
            assert res["error"] == "PeerError", (
                f"rank {rank}: a dead peer must raise PeerError naming it (got {res})")
            assert f"rank {victim}" in res["message"], f"rank {rank}: PeerError must name rank {victim}: {res}"

    def test_close_fails_pending_work(self) -> None:
        """destroy_process_group() (the channel's close()) fails every pending Work with a
        ProcGroupError (ChannelClosedError, say) instead of leaving it to its timeout."""
        if 2 not in self.world_sizes:
            pytest.skip("needs world size 2")
        if "close_fails_pending_work" in self.unsupported:
            pytest.skip(f"{self.backend}: {self.unsupported['close_fails_pending_work']}")
        res = self._spawn(_close_fails_pending, 2, timeout=30.0, job_timeout=90.0)[0]
        for name in ("irecv", "all_reduce"):
            assert res[name]["error"] not in (None, "CommTimeoutError"), (
                f"{name} pending at close(): {res[name]}")
            assert not res[name]["error"].startswith("not a"), f"{name}: {res[name]}"
        assert res["seconds"] < 30.0, f"the pending Works waited out the timeout: {res}"

    def test_collective_timeout_names_missing_ranks(self) -> None:
        if 2 not in self.world_sizes:
            pytest.skip("needs world size 2")
        results = self._spawn(_nobody_joins, 2, timeout=1.5, job_timeout=60.0)
        assert results[0]["error"] == "CommTimeoutError", results[0]
        assert "all_reduce" in results[0]["message"] and "rank 1" in results[0]["message"], results[0]


def _make_test(name: str) -> Callable[[ConformanceSuite, Any], None]:
    def test(self: ConformanceSuite, suite_results: Any) -> None:
        if name in self.unsupported:
            pytest.skip(f"{self.backend}: {self.unsupported[name]}")
        self._report(suite_results, name)

    test.__name__ = f"test_{name}"
    test.__doc__ = (_checks.CHECKS[name].__doc__ or f"conformance check {name}").strip()
    return test


for _name in _checks.CHECKS:
    setattr(ConformanceSuite, f"test_{_name}", _make_test(_name))
