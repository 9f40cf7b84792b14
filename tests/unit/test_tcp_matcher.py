"""tcp's matcher: posting, matching, any-source, ordering, cancelling, poisoned tags (in process).

The reader's side is played by calling ``match_incoming`` and filling the landing the
way ``_reader`` does (``admit``, copy, ``finish``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.errors import CommTimeoutError, InvalidArrayError, MismatchError, PeerError, WorkCancelledError
from procgroup_tcp._match import DISCARD, IDLE, Matcher, PostedRecv, Unexpected
from procgroup_tcp._wire import NO_FP, byte_view

pytestmark = pytest.mark.unit


def _matcher(timeout: float = 0.5, refuse: set[int] | None = None) -> Matcher:
    def check(src: int | None, tag: int) -> None:
        if refuse and src in refuse:
            raise PeerError(f"rank {src} has left the group", rank=src)
    return Matcher(timeout, lambda r: r + 100, check)


def _arrive(m: Matcher, src: int, tag: int, payload: np.ndarray, fp: bytes = NO_FP) -> object:
    """A frame from ``src`` as the reader lands it; returns where it went."""
    data = byte_view(payload)
    landing = m.match_incoming(src, tag, data.nbytes, payload.dtype.char.encode(), fp)
    if landing is DISCARD:
        return landing
    try:
        view = landing.admit(data.nbytes, payload.dtype.char.encode(), src + 100)
    except Exception as exc:  # noqa: BLE001 - the receive's error, as the reader reports it
        landing.finish(src, exc)
        return landing
    view[:] = data
    landing.finish(src)
    return landing


def _post(m: Matcher, into: np.ndarray, src: int | None, tag: int) -> object:
    return m.post(byte_view(into), src, tag, into.dtype)


def test_a_frame_lands_in_the_receive_posted_for_it() -> None:
    m = _matcher()
    into = np.zeros(3)
    req = _post(m, into, 1, 5)
    assert isinstance(req, PostedRecv) and not req.is_completed()
    assert _arrive(m, 1, 5, np.array([1.0, 2.0, 3.0])) is req
    assert req.wait() and req.result() == 1 and into.tolist() == [1.0, 2.0, 3.0]
    assert not m.posted and not m.unexpected


def test_a_frame_nobody_waits_for_is_queued_and_taken_by_the_next_receive() -> None:
    m = _matcher()
    assert isinstance(_arrive(m, 2, 7, np.array([4, 5], dtype=np.int32)), Unexpected)
    into = np.zeros(2, dtype=np.int32)
    work = _post(m, into, 2, 7)
    assert work.is_completed() and work.result() == 2 and into.tolist() == [4, 5]
    assert not m.unexpected


def test_an_any_source_receive_takes_the_first_sender() -> None:
    m = _matcher()
    into = np.zeros(1)
    req = _post(m, into, None, 1)
    assert _arrive(m, 3, 1, np.array([9.0])) is req
    assert req.result() == 3 and into[0] == 9.0


def test_a_receive_from_one_rank_ignores_the_others() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 0)
    assert isinstance(_arrive(m, 2, 0, np.array([1.0])), Unexpected)
    assert not req.completed and m.posted == [req]


def test_tags_keep_messages_apart() -> None:
    m = _matcher()
    a, b = np.zeros(1), np.zeros(1)
    ra, rb = _post(m, a, 0, 1), _post(m, b, 0, 2)
    _arrive(m, 0, 2, np.array([2.0]))
    _arrive(m, 0, 1, np.array([1.0]))
    assert ra.completed and rb.completed and (a[0], b[0]) == (1.0, 2.0)


@settings(deadline=None, max_examples=50)
@given(values=st.lists(st.integers(0, 1000), min_size=1, max_size=8), posted_first=st.integers(0, 8))
def test_messages_of_one_sender_and_tag_arrive_in_order(values: list[int], posted_first: int) -> None:
    """Whether each receive was posted before its frame or took it from the queue, the
    n-th receive gets the n-th message (MPI's non-overtaking rule)."""
    m = _matcher()
    outs = [np.zeros(1, dtype=np.int64) for _ in values]
    works = [_post(m, out, 0, 4) for out in outs[:posted_first]]
    for v in values:
        _arrive(m, 0, 4, np.array([v], dtype=np.int64))
    works += [_post(m, out, 0, 4) for out in outs[posted_first:]]
    for w in works:
        w.wait()
    assert [int(o[0]) for o in outs] == values


def test_a_larger_frame_fails_its_receive_naming_the_sender() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 0)
    _arrive(m, 1, 0, np.zeros(4))
    with pytest.raises(PeerError, match="rank 101 sent a message of 32 bytes"):
        req.wait()


def test_a_frame_of_another_dtype_fails_its_receive() -> None:
    m = _matcher()
    req = _post(m, np.zeros(2, dtype=np.float32), 1, 0)
    _arrive(m, 1, 0, np.zeros(2, dtype=np.int32))
    with pytest.raises(InvalidArrayError, match="dtype int32"):
        req.wait()


def test_a_queued_frame_of_the_wrong_size_is_refused_at_posting() -> None:
    m = _matcher()
    _arrive(m, 1, 0, np.zeros(3))
    with pytest.raises(PeerError, match="24 bytes into a receive buffer of 8"):
        _post(m, np.zeros(1), 1, 0)


def test_cancel_withdraws_a_receive_no_frame_matched() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 0)
    assert req.cancel() and req.cancel()  # and it stays cancelled
    with pytest.raises(WorkCancelledError, match="withdrawn"):
        req.wait()
    assert isinstance(_arrive(m, 1, 0, np.array([1.0])), Unexpected)  # the frame waits for the next one


def test_cancel_after_the_frame_matched_is_refused() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 0)
    _arrive(m, 1, 0, np.array([1.0]))
    assert not req.cancel() and req.wait()


def test_a_bounded_wait_leaves_the_receive_posted() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 0)
    with pytest.raises(CommTimeoutError, match="rank 101"):
        req.wait(0.01)
    assert m.posted == [req]
    _arrive(m, 1, 0, np.array([1.0]))
    assert req.wait()


def test_running_out_the_channel_timeout_withdraws_the_receive() -> None:
    m = _matcher(timeout=0.02)
    req = _post(m, np.zeros(1), None, 0)
    with pytest.raises(CommTimeoutError, match="any rank"):
        req.wait()
    assert not m.posted


def test_a_frame_landed_by_another_thread_ends_the_wait() -> None:
    m = _matcher(timeout=5.0)
    into = np.zeros(1)
    req = _post(m, into, 0, 0)
    timer = threading.Timer(0.02, _arrive, (m, 0, 0, np.array([7.0])))
    timer.start()
    assert req.wait() and into[0] == 7.0
    timer.join()


def test_a_poisoned_tag_fails_its_receives_and_drops_its_frames() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 9)
    other = _post(m, np.zeros(1), 1, 8)
    assert m.poison(9, MismatchError("ranks disagree"))
    assert not m.poison(9, MismatchError("again"))  # once
    with pytest.raises(MismatchError, match="disagree"):
        req.wait()
    assert _arrive(m, 1, 9, np.array([1.0])) is DISCARD
    with pytest.raises(MismatchError):
        _post(m, np.zeros(1), 1, 9)
    assert m.posted == [other] and isinstance(m.dead_error(9), MismatchError)


def test_a_queued_frame_with_another_fingerprint_is_a_mismatch() -> None:
    m = _matcher()
    _arrive(m, 1, 3, np.array([1.0]), fp=b"a" * 32)
    seen = []

    def mismatched(tag: int, mine: bytes, theirs: bytes, ux: Unexpected) -> BaseException:
        seen.append((tag, mine[:1], theirs[:1], ux.src))
        return MismatchError("disagree")

    with pytest.raises(MismatchError):
        m.post(byte_view(np.zeros(1)), 1, 3, np.dtype("f8"), b"b" * 32, mismatched)
    assert seen == [(3, b"b", b"a", 1)]


def test_fail_from_fails_only_the_receives_that_wait_on_that_rank() -> None:
    m = _matcher()
    mine, anyone, other = _post(m, np.zeros(1), 1, 0), _post(m, np.zeros(1), None, 0), _post(m, np.zeros(1), 2, 0)
    m.fail_from(1, PeerError("rank 101 has left the group", rank=101))
    assert mine.completed and not anyone.completed and not other.completed
    with pytest.raises(PeerError, match="left"):
        mine.wait()


def test_fail_all_fails_every_receive_and_every_payload_still_arriving() -> None:
    m = _matcher()
    req = _post(m, np.zeros(1), 1, 0)
    ux = m.match_incoming(2, 0, 8, b"d", NO_FP)  # its payload never comes
    m.fail_all(PeerError("rank 102 died", rank=102))
    assert req.completed and isinstance(ux, Unexpected) and ux.done.is_set()
    with pytest.raises(PeerError, match="died"):
        _post(m, np.zeros(1), 2, 0)


def test_the_channel_may_refuse_a_new_receive() -> None:
    m = _matcher(refuse={4})
    with pytest.raises(PeerError, match="left"):
        _post(m, np.zeros(1), 4, 0)
    _arrive(m, 4, 0, np.array([3.0]))  # what it sent before leaving is still delivered
    assert _post(m, np.zeros(1), 4, 0).result() == 4


def test_unclaimed_sees_queued_frames_and_earlier_receives() -> None:
    m = _matcher()
    assert m.unclaimed(1, 0)
    req = _post(m, np.zeros(1), None, 0)
    assert not m.unclaimed(1, 0) and m.unclaimed(1, 1)
    req.cancel()
    _arrive(m, 1, 0, np.array([1.0]))
    assert not m.unclaimed(1, 0)


def test_the_progress_strategy_is_chosen_once() -> None:
    m = _matcher()
    assert m.progress is IDLE
    m.start(IDLE.__class__())
    with pytest.raises(RuntimeError, match="once"):
        m.start(IDLE.__class__())
