"""The survivors' agreement (procgroup.backend._survival) as a state machine, in process.

Each member is a ``Survival`` over a small in-memory control plane: a control send is the
JSON bytes handed to the destination's ``received`` (through ``parse``, as a backend's
reader thread does), and a dead member's sends and receives vanish. The network is the
only thing replaced; the protocol under test is the one every backend runs.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.backend._survival import MAX_CONTROL_BYTES, Decision, Survival, parse
from procgroup.errors import CommTimeoutError, GroupRevokedError, PeerError

pytestmark = pytest.mark.unit


class Plane:
    """The control plane of one group of ``size`` members; ``kill`` makes one vanish."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.dead: set[int] = set()
        self.members = [Member(self, r) for r in range(size)]
        self.survivals = [Survival(m) for m in self.members]  # type: ignore[arg-type]  # Member is the channel's control-plane part

    def deliver(self, src: int, dst: int, body: bytes) -> None:
        if src in self.dead or dst in self.dead:
            return
        msg = parse(body)
        assert msg is not None, body  # the protocol's own messages always parse
        self.survivals[dst].received(src, msg)

    def kill(self, rank: int) -> None:
        """``rank`` dies: every other member's channel reports it."""
        self.dead.add(rank)
        for r, s in enumerate(self.survivals):
            if r != rank:
                s.died(rank)

    def agree_all(self, flags: dict[int, bool], timeout: float = 10.0,
                  extra: bytes = b"") -> dict[int, Decision | BaseException]:
        """Every rank in ``flags`` calls agree at once, each on its own thread."""
        out: dict[int, Decision | BaseException] = {}

        def run(rank: int) -> None:
            try:
                out[rank] = self.survivals[rank].agree(flags[rank], timeout, extra=lambda: extra)
            except BaseException as exc:  # noqa: BLE001 - compared by the test
                out[rank] = exc

        threads = [threading.Thread(target=run, args=(r,)) for r in flags]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 5)
        return out

    def close(self) -> None:
        for s in self.survivals:
            s.stop()


class Member:
    """What Survival needs of its channel: identity, the control send, and the two reports."""

    def __init__(self, plane: Plane, rank: int) -> None:
        self.plane, self.rank, self.size, self.control_id = plane, rank, plane.size, 0
        self.interrupted: list[BaseException] = []
        self.deaths: list[int] = []

    def do_control_send(self, dst: int, body: bytes) -> None:
        self.plane.deliver(self.rank, dst, body)

    def interrupt(self, exc: BaseException) -> None:
        self.interrupted.append(exc)

    def peer_died(self, rank: int, exc: BaseException) -> None:
        self.deaths.append(rank)


@pytest.fixture
def plane4() -> Any:
    plane = Plane(4)
    yield plane
    plane.close()


def test_all_true_agree_true_everywhere(plane4: Plane) -> None:
    out = plane4.agree_all({r: True for r in range(4)}, extra=b"store at host:1")
    assert set(out) == {0, 1, 2, 3}
    assert all(d == Decision(True, frozenset(), b"store at host:1") for d in out.values()), out


def test_one_false_makes_it_false_everywhere(plane4: Plane) -> None:
    out = plane4.agree_all({0: True, 1: True, 2: False, 3: True})
    assert {d.value for d in out.values() if isinstance(d, Decision)} == {False}
    assert len(out) == 4


def test_repeated_agreements_stay_in_step(plane4: Plane) -> None:
    for step in range(20):  # also exercises forgetting old calls' records
        out = plane4.agree_all({r: (step % 3 != 0 or r != 1) for r in range(4)})
        assert len(out) == 4 and all(isinstance(d, Decision) for d in out.values()), out
        assert {d.value for d in out.values() if isinstance(d, Decision)} == {step % 3 != 0}


def test_a_known_death_is_in_every_decision(plane4: Plane) -> None:
    plane4.kill(2)
    out = plane4.agree_all({0: True, 1: True, 3: True})
    assert all(d == Decision(True, frozenset({2}), b"") for d in out.values()), out


def test_the_coordinator_dies_and_the_next_takes_over() -> None:
    plane = Plane(4)
    try:
        plane.kill(0)  # rank 0 would coordinate: rank 1 takes over and asks the others first
        out = plane.agree_all({1: True, 2: False, 3: True})
        assert all(d == Decision(False, frozenset({0}), b"") for d in out.values()), out
    finally:
        plane.close()


def test_a_death_one_member_reports_is_adopted_by_all() -> None:
    """Rank 1 counts rank 2 dead (its channel said so); rank 0 has not noticed. The
    decision names 2 on both, rank 0's channel is told, and rank 2, which is alive after
    all, learns it was counted out instead of going on in a split world."""
    plane = Plane(3)
    try:
        plane.survivals[1].died(2)
        out = plane.agree_all({0: True, 1: True, 2: True})
        assert out[0] == out[1] == Decision(True, frozenset({2}), b""), out
        assert plane.members[0].deaths == [2] and 2 in plane.survivals[0].dead
        assert isinstance(out[2], PeerError) and "counted this rank (rank 2) as dead" in str(out[2])
    finally:
        plane.close()


def test_a_silent_member_times_the_coordinator_out_naming_it() -> None:
    plane = Plane(3)
    try:
        plane.dead.add(2)  # vanished, and nobody has been told
        out = plane.agree_all({0: True, 1: True}, timeout=0.6)
        assert isinstance(out[0], CommTimeoutError) and out[0].ranks == (2,), out
        assert isinstance(out[1], CommTimeoutError) and out[1].ranks == (0,), out
    finally:
        plane.close()


def test_revoke_reaches_every_live_member_once(plane4: Plane) -> None:
    plane4.survivals[1].revoke()
    for _ in range(3):  # the revoke travels on sender threads, and is passed on once
        for s in plane4.survivals:
            s.drain(5.0)
    for r in range(4):
        assert plane4.survivals[r].revoked
        got = plane4.members[r].interrupted
        assert len(got) == 1 and isinstance(got[0], GroupRevokedError)
    assert "revoked by rank 1" in str(plane4.members[0].interrupted[0])
    assert "revoked by this rank" in str(plane4.members[1].interrupted[0])


def test_parse_refuses_what_is_not_a_control_message() -> None:
    assert parse(b'{"g": 0, "t": "revoke"}') == {"g": 0, "t": "revoke"}
    for junk in (b"", b"\xff\xfe", b"[1, 2]", b'{"t": "revoke"}', b'{"g": "0"}', b"null"):
        assert parse(junk) is None
    assert parse(b'{"g": 0, "pad": "' + b"x" * MAX_CONTROL_BYTES + b'"}') is None


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=256))
def test_parse_never_raises_on_a_peers_bytes(payload: bytes) -> None:
    msg = parse(payload)
    assert msg is None or isinstance(msg, dict)


_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**40), st.text(max_size=8),
                    st.lists(st.integers(-2, 6), max_size=8))


@settings(max_examples=100, deadline=None)
@given(src=st.integers(-2, 5), msg=st.fixed_dictionaries(
    {"g": st.just(0), "t": st.sampled_from(["contrib", "query", "decide", "bogus"])},
    optional={"i": _values, "f": _values, "d": _values, "v": _values, "x": _values}))
def test_a_malformed_message_never_breaks_the_state(src: int, msg: dict[str, Any]) -> None:
    """Whatever a peer sends, received() neither raises nor records a bad decision."""
    plane = Plane(4)
    s = plane.survivals[0]
    s.received(src, msg)
    for decision in s._decided.values():  # what a malformed decide could have stored
        assert isinstance(decision.value, bool)
        assert all(0 <= r < 4 for r in decision.dead)
    plane.close()
