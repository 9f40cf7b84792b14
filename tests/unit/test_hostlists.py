"""Slurm-style host lists (procgroup.rendezvous._slurm) and the master address and port
env:// derives from a Slurm job's variables."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.errors import InvalidArgumentError
from procgroup.rendezvous import _slurm

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, hosts", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[01-03,07],gpu7", ["n01", "n02", "n03", "n07", "gpu7"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    (" a , b[2] ", ["a", "b2"]),
])
def test_expand(text: str, hosts: list[str]) -> None:
    assert _slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, why", [
    ("", "it is empty"), ("n[1-3", "'[' without ']'"), ("n1-3]", "']' without '['"),
    ("n[[1]]", "nested"), ("n[3-1]", "runs backwards"), ("n[a]", "bad range"), ("a,,b", "an empty entry"),
    ("n[0-1000000]", "more than"), ("x[1-1000]y[1-1001]", "more than"),
])
def test_bad_lists_say_why_and_what_to_set(text: str, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match="SLURM_JOB_NODELIST") as info:
        _slurm.expand_hostlist(text, "SLURM_JOB_NODELIST")
    assert why in str(info.value) and "set MASTER_ADDR" in str(info.value)


def test_first_host_expands_only_the_first_entry() -> None:
    assert _slurm.first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert _slurm.first_host("a,b[1-99999999999]") == "a"


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab0129[]-,", max_size=24))
def test_any_text_expands_or_is_refused(text: str) -> None:
    """Whatever the variable holds, a list of non-empty names or InvalidArgumentError."""
    try:
        hosts = _slurm.expand_hostlist(text)
    except InvalidArgumentError:
        return
    assert hosts and all(h and "[" not in h and "]" not in h and "," not in h for h in hosts)
    assert len(hosts) <= _slurm.MAX_HOSTS


@given(st.lists(st.tuples(st.sampled_from(["n", "gpu", "r-"]), st.integers(0, 30), st.integers(0, 5)),
                min_size=1, max_size=4))
def test_ranges_expand_to_every_number_in_order(parts: list[tuple[str, int, int]]) -> None:
    text = ",".join(f"{p}[{lo}-{lo + span}]" for p, lo, span in parts)
    want = [f"{p}{n}" for p, lo, span in parts for n in range(lo, lo + span + 1)]
    assert _slurm.expand_hostlist(text) == want


def test_master_address_and_port_from_a_job_step() -> None:
    env = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": "n[05-06]",
           "SLURM_JOB_NODELIST": "n[01-09]"}
    assert _slurm.master_addr(env) == ("n05", "SLURM_STEP_NODELIST")
    assert _slurm.master_port(env) == 20000 + 234 * 10 + 3
    batch = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "n[01-09]"}
    assert _slurm.master_addr(batch) == ("n01", "SLURM_JOB_NODELIST")
    assert _slurm.master_port(batch) == 20000 + 234 * 10 + 9  # the batch script's slot
    assert _slurm.master_port({}) is None and _slurm.master_addr({}) == (None, "")
    assert not _slurm.in_job({"SLURM_JOB_ID": "x"}) and _slurm.in_job(batch)


@given(st.integers(0, 10**9), st.one_of(st.none(), st.integers(0, 2**32)))
def test_every_step_gets_a_port_in_range(job: int, step: int | None) -> None:
    env = {"SLURM_JOB_ID": str(job)} | ({} if step is None else {"SLURM_STEP_ID": str(step)})
    port = _slurm.master_port(env)
    assert port is not None and 20000 <= port <= 29999
    if step is not None and step < 0xFFFFFFF0:  # a numbered step never takes the batch script's port
        assert port != _slurm.master_port({"SLURM_JOB_ID": str(job)})
