"""Op fingerprints (procgroup.backend) and tcp's per-collective records and ledger (in process)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.backend import Fingerprint, mismatch
from procgroup.backend._context import OPS
from procgroup.errors import MismatchError
from procgroup.ops import ReduceOp
from procgroup_tcp._fingerprints import DONE_TAGS, Collective, Fingerprints, Ledger

pytestmark = pytest.mark.unit

_fingerprints = st.builds(
    Fingerprint,
    op=st.sampled_from(list(OPS)),
    seq=st.integers(0, (1 << 64) - 1),
    dtype=st.sampled_from(list("fdbhilqBHILQe?")),
    nbytes=st.integers(0, (1 << 64) - 1),
    root=st.integers(-1, (1 << 31) - 1),
    reduce_op=st.one_of(st.none(), st.sampled_from(list(ReduceOp))),
)


@settings(deadline=None, max_examples=80)
@given(fp=_fingerprints)
def test_a_fingerprint_packs_into_32_bytes_and_back(fp: Fingerprint) -> None:
    packed = fp.pack()
    assert len(packed) == 32
    assert Fingerprint.unpack(packed) == fp


@settings(deadline=None, max_examples=80)
@given(raw=st.binary(min_size=32, max_size=32))
def test_any_32_bytes_from_a_peer_unpack_and_describe(raw: bytes) -> None:
    """A peer's fingerprint is only ever described in an error message: it must never crash."""
    fp = Fingerprint.unpack(raw)
    assert isinstance(fp.describe(), str) and fp.describe()


def test_describe_says_what_the_rank_called() -> None:
    fp = Fingerprint.of("reduce", 7, np.zeros(4, dtype=np.float32), root=2, reduce_op=ReduceOp.MAX)
    assert fp.describe() == "reduce #7 of 16 bytes of float32, root 2, with MAX"
    assert Fingerprint.of("barrier", 1).describe() == "barrier #1 of 0 bytes of uint8"


def test_mismatch_names_both_ranks_and_both_calls() -> None:
    mine = Fingerprint.of("all_reduce", 3, np.zeros(2))
    theirs = Fingerprint.of("broadcast", 3, np.zeros(2), root=0)
    exc = mismatch(mine, theirs, 5, 1)
    assert isinstance(exc, MismatchError) and list(exc.ranks) == [1, 5]
    assert "rank 5 called all_reduce #3" in str(exc) and "rank 1 called broadcast #3" in str(exc)


def test_each_collective_of_a_channel_gets_the_next_sequence_number() -> None:
    fps = Fingerprints()
    arr = np.zeros(3, dtype=np.int32)
    first, second = fps.next("all_reduce", arr, -1, ReduceOp.SUM), fps.next("all_reduce", arr, -1, ReduceOp.SUM)
    assert Fingerprint.unpack(first).seq == 0 and Fingerprint.unpack(second).seq == 1
    assert first[:8] == second[:8] and first[16:] == second[16:]  # the cache changes only seq


@pytest.mark.parametrize(("a", "b"), [
    (("all_reduce", np.zeros(2), -1, ReduceOp.SUM), ("all_reduce", np.zeros(3), -1, ReduceOp.SUM)),
    (("all_reduce", np.zeros(2), -1, ReduceOp.SUM), ("all_reduce", np.zeros(2), -1, ReduceOp.MAX)),
    (("all_reduce", np.zeros(2), -1, ReduceOp.SUM), ("all_reduce", np.zeros(2, np.int64), -1, ReduceOp.SUM)),
    (("broadcast", np.zeros(2), 0, None), ("broadcast", np.zeros(2), 1, None)),
    (("gather", np.zeros(2), 0, None), ("scatter", np.zeros(2), 0, None)),
])
def test_calls_that_differ_get_different_fingerprints(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]  # any call's arguments
    assert Fingerprints().next(*a) != Fingerprints().next(*b)


def test_a_collective_record_is_a_frozen_value() -> None:
    call = Collective(tag=5, fp=bytes(32))
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.tag = 6  # type: ignore[misc]  # assigning a frozen field on purpose
    assert call == Collective(5, bytes(32))


def test_a_collective_that_ends_well_leaves_the_active_table() -> None:
    ledger = Ledger()
    ledger.active[10] = b"a" * 32
    assert ledger.finished(10, b"a" * 32, group_id=0) is None
    assert 10 not in ledger.active and ledger.done[10] == (b"a" * 32, 0)


def test_a_mismatch_found_after_a_rank_returned_is_raised_by_its_next_collective() -> None:
    ledger = Ledger()
    fp = Fingerprint.of("reduce", 0, np.zeros(1), root=0).pack()
    ledger.finished(1, fp, group_id=3)
    ledger.mark_late(1, MismatchError("ranks disagree", ranks=[0, 1]))
    ledger.mark_late(1, MismatchError("again", ranks=[0, 1]))  # reported once
    assert ledger.finished(2, fp, group_id=4) is None  # another group's collective
    exc = ledger.finished(3, fp, group_id=3)
    assert isinstance(exc, MismatchError) and "an earlier collective of this group (reduce #0" in str(exc)
    assert ledger.finished(4, fp, group_id=3) is None


def test_the_end_check_can_fail_a_collective_once() -> None:
    ledger = Ledger()
    ledger.check_end = lambda tag, fp: MismatchError("queued frame of another op")
    assert isinstance(ledger.finished(1, bytes(32), 0), MismatchError)


def test_the_ledger_remembers_a_bounded_number_of_collectives() -> None:
    ledger = Ledger()
    for tag in range(DONE_TAGS + 10):
        ledger.finished(tag, bytes(32), 0)
    assert len(ledger.done) == DONE_TAGS and 0 not in ledger.done and DONE_TAGS + 9 in ledger.done
