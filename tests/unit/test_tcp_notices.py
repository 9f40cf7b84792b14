"""tcp's lost-peer and peer-left notice bodies: a world rank, then a reason (in process)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup_tcp._wire import KIND_PEER_LEFT, KIND_PEER_LOST, KINDS, LOST, MAX_LOST_BYTES, pack_lost, unpack_lost

pytestmark = pytest.mark.unit
#: no deadline: the suite may share a loaded machine; a bounded number of examples keeps it fast
FAST = settings(deadline=None, max_examples=100)


@FAST
@given(st.integers(-(2**63), 2**63 - 1), st.text(max_size=200))
def test_a_notice_reads_back_as_written(rank: int, reason: str) -> None:
    assert unpack_lost(pack_lost(rank, reason)) == (rank, reason)


@FAST
@given(st.integers(0, 1 << 20), st.text(min_size=MAX_LOST_BYTES // 3, max_size=MAX_LOST_BYTES * 2))
def test_a_long_reason_is_cut_to_fit_at_a_character(rank: int, reason: str) -> None:
    body = pack_lost(rank, reason)
    assert len(body) <= MAX_LOST_BYTES
    got_rank, got_reason = unpack_lost(body)
    assert got_rank == rank and reason.startswith(got_reason)
    room = MAX_LOST_BYTES - LOST.size
    if len(reason.encode()) <= room:
        assert got_reason == reason
    else:  # cut: at most one character's bytes (up to 4) short of the room
        assert room - 4 < len(got_reason.encode()) <= room


@pytest.mark.parametrize("size", [0, LOST.size - 1, MAX_LOST_BYTES + 1])
def test_a_body_out_of_bounds_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match=f"{size} bytes"):
        unpack_lost(bytes(size))


@FAST
@given(st.binary(min_size=LOST.size, max_size=MAX_LOST_BYTES))
def test_any_bytes_in_bounds_give_a_rank_and_a_text(raw: bytes) -> None:
    rank, reason = unpack_lost(raw)
    assert isinstance(rank, int) and isinstance(reason, str)


def test_the_peer_left_notice_is_a_kind_of_its_own() -> None:
    assert KIND_PEER_LEFT in KINDS and KIND_PEER_LEFT != KIND_PEER_LOST
