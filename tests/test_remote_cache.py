"""The worker's caching allocator of master-worker mode (procgroup.remote._cache), with
real processes: a master and two nodes on tcp.

One job runs with a small limit (PROCGROUP_REMOTE_CACHE_BYTES=6 MiB) and checks reuse,
safety (views, a remote.run function's array, a queued send on another stream, a
finished transfer), exact results over many .to()/free cycles and the limit; one runs
with 0 (the cache off); one with a bad value (a clear error at init). The checks live in
tests/mw_cache_checks.py and print one JSON line of results.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from test_master_worker import launch as launch_job
from test_master_worker import results_of as master_results

HERE = Path(__file__).parent
CHECKS = HERE / "mw_cache_checks.py"
JOB_TIMEOUT = 240.0
LIMIT = 6 << 20

CACHE_CHECKS = ["reuse_only_when_no_view_is_alive", "a_run_function_that_kept_an_array_keeps_its_block",
                "a_queued_send_on_another_stream_keeps_its_block", "results_stay_exact_across_many_to_and_free_cycles",
                "a_fetched_array_is_reused_once_its_transfer_is_done", "the_limit_is_honoured"]


def launch(script: Path, world: int, args: list[str], cache_bytes: str,
           timeout: float = JOB_TIMEOUT) -> list[tuple[int, str, str]]:
    """test_master_worker's launcher, with the cache limit set on every rank."""
    env = {"PROCGROUP_REMOTE_CACHE_BYTES": cache_bytes, "MW_CACHE_BYTES": cache_bytes, "MW_BACKEND": "tcp"}
    return launch_job(script, world, args, env=env, timeout=timeout)


def results_of(ranks: list[tuple[int, str, str]]) -> dict[str, str | None]:
    for r, (code, so, se) in enumerate(ranks):
        assert code == 0, f"rank {r} exited with {code}:\n{so[-2000:]}\n{se[-3000:]}"
    return master_results(ranks[0][1], ranks[0][2])


@pytest.fixture(scope="module")
def cache_job() -> dict[str, str | None]:
    return results_of(launch(CHECKS, 3, CACHE_CHECKS, str(LIMIT)))


@pytest.mark.parametrize("check", CACHE_CHECKS)
def test_cache(cache_job: dict[str, str | None], check: str) -> None:
    assert check in cache_job, f"{check} did not run"
    assert cache_job[check] is None, cache_job[check]


def test_zero_disables_the_cache() -> None:
    results = results_of(launch(CHECKS, 3, ["zero_disables_the_cache"], "0"))
    assert results["zero_disables_the_cache"] is None, results["zero_disables_the_cache"]


def test_a_bad_setting_is_a_clear_error_at_init(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent("""
        import procgroup as pg
        try:
            pg.init_master_worker("tcp")
        except pg.InvalidArgumentError as exc:
            print("REFUSED", exc, flush=True)
            assert not pg.is_initialized()
    """))
    ranks = launch(script, 3, [], "lots", timeout=90)
    for r, (code, _, se) in enumerate(ranks):
        assert code == 0, f"rank {r} exited with {code}: {se[-2000:]}"
    out = ranks[0][1]
    assert "REFUSED" in out and "PROCGROUP_REMOTE_CACHE_BYTES='lots'" in out, out
    assert "node 0 (rank 1)" in out and "node 1 (rank 2)" in out, out
