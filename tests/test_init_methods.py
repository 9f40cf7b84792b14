"""Every init method, end to end: real ranks join over it and run a collective on tcp."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from procgroup.errors import InvalidArgumentError
from procgroup.testing import spawn
from procgroup.testing._spawn import free_port


def _sum_ranks(rank: int, size: int) -> tuple[int, int, float]:
    import procgroup as pg

    arr = np.array([float(pg.get_rank())])
    pg.all_reduce(arr)
    return pg.get_rank(), pg.get_world_size(), float(arr[0])


def _check(results: list[tuple[int, int, float]], size: int) -> None:
    assert sorted(r for r, _, _ in results) == list(range(size))
    assert all(s == size and total == sum(range(size)) for _, s, total in results)


@pytest.mark.parametrize("size", [1, 3])
def test_tcp_url(size: int) -> None:
    _check(spawn(_sum_ranks, size, init_method=f"tcp://127.0.0.1:{free_port()}"), size)


def test_env_variables() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "3"}

    results = spawn(_env_rank, 3, init=False, env=env)
    _check(results, 3)


def _env_rank(rank: int, size: int) -> tuple[int, int, float]:
    import os

    import procgroup as pg

    os.environ["RANK"] = str(rank)
    pg.init_process_group("tcp", "env://", timeout=30)
    try:
        return _sum_ranks(rank, size)
    finally:
        pg.destroy_process_group()


def _mpich_rank(rank: int, size: int) -> tuple[int, int, float]:
    import os

    import procgroup as pg

    os.environ.update(PMI_RANK=str(rank), PMI_SIZE=str(size))
    pg.init_process_group("tcp", timeout=30)  # env:// is the default
    try:
        return _sum_ranks(rank, size)
    finally:
        pg.destroy_process_group()


def test_env_reads_mpich_rank_variables() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    _check(spawn(_mpich_rank, 2, init=False, env=env), 2)


def _file_auto_rank(rank: int, size: int, url: str) -> tuple[int, int, float]:
    import procgroup as pg

    pg.init_process_group("tcp", url, world_size=size, timeout=30)  # no rank: assigned by the file
    try:
        return _sum_ranks(rank, size)
    finally:
        pg.destroy_process_group()


def test_file_assigns_ranks_and_separates_jobs(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/shared"
    _check(spawn(_file_auto_rank, 3, init=False, args=(url,)), 3)
    assert not (tmp_path / "shared").exists(), "the rendezvous file should be removed after the job"


def test_bad_urls_name_the_scheme() -> None:
    import procgroup as pg

    with pytest.raises(InvalidArgumentError, match=r"^tcp://.*rank"):
        pg.init_process_group("tcp", "tcp://127.0.0.1:1234", world_size=2)
    with pytest.raises(InvalidArgumentError, match=r"^bogus://: unknown init method; choose one of: env://"):
        pg.init_process_group("tcp", "bogus://x", rank=0, world_size=1)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        pg.init_process_group("tcp", "tcp://127.0.0.1:1", rank=0, world_size=1, timeout=-1)
    with pytest.raises(InvalidArgumentError, match="world_size"):
        pg.init_process_group("tcp", "tcp://127.0.0.1:1", rank=0, world_size=0)
    assert not pg.is_initialized()


def _token_rank(rank: int, size: int) -> tuple[bool, bool, bool]:
    import os

    import procgroup as pg
    from procgroup import _auth, _state

    pg.init_process_group("tcp", os.environ["TEST_URL"], rank=rank, world_size=size,
                          token="the-job-token", timeout=30)
    try:
        key = _auth.job_key("the-job-token")
        st = _state.state
        assert st is not None and st.world.channel is not None
        sub = pg.new_group([0, 1])
        sub_ok = sub.channel is not None and sub.channel.ctx.job_key == key
        return st.job_key == key, st.world.channel.ctx.job_key == key, sub_ok
    finally:
        pg.destroy_process_group()


def test_token_argument_reaches_every_channel() -> None:
    env = {"TEST_URL": f"tcp://127.0.0.1:{free_port()}"}
    assert spawn(_token_rank, 2, init=False, env=env) == [(True, True, True)] * 2
