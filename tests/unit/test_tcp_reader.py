"""tcp's frame reader over a real socketpair: frames, partial reads, every protocol
violation a peer could send, and the peer's life (``PeerState``) as the stream ends."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.backend import MAX_CONTROL_BYTES
from procgroup.errors import InvalidArrayError, PeerError
from procgroup_tcp import _wire
from procgroup_tcp._conn import Peer, PeerEvents
from procgroup_tcp._match import Matcher, PostedRecv, Unexpected
from procgroup_tcp._peer_state import TRANSITIONS, PeerState
from procgroup_tcp._progress import FRAME, NOTHING, OVER, TICK_S
from procgroup_tcp._reader import BUFFER_BYTES, MAX_FRAME_BYTES

pytestmark = pytest.mark.unit

_TICK = struct.pack("@ll", 0, int(TICK_S * 1e6))


class Events(PeerEvents):
    """The layer above, as the channel plays it: frames go to a real Matcher, the other
    events are recorded."""

    def __init__(self) -> None:
        self.matcher = Matcher(1.0, lambda r: r, lambda src, tag: None)
        self.seen: list[tuple[Any, ...]] = []

    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes, fp: bytes) -> Any:
        return self.matcher.match_incoming(src, tag, nbytes, dtype_char, fp)

    def mismatch_notice(self, peer: Peer, tag: int, notice: bytes) -> None:
        self.seen.append(("mismatch", tag, _wire.NOTICE.unpack(notice)[:2]))

    def peer_lost_notice(self, peer: Peer, lost: int, reason: str) -> None:
        self.seen.append(("lost", lost, reason))

    def control_message(self, peer: Peer, body: bytes) -> None:
        self.seen.append(("control", body))

    def fingerprint_probe(self, peer: Peer, tag: int, fp: bytes) -> None:
        self.seen.append(("probe", tag, fp[:1]))

    def peer_left(self, peer: Peer) -> None:
        self.seen.append(("left",))

    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        self.seen.append(("failed", str(exc)))
        peer.reader.fail_current(exc)  # as the channel does: the payload being landed fails


class Link:
    """A Peer (rank 1, world rank 11) reading one end of a socketpair; ``out`` writes frames."""

    def __init__(self) -> None:
        self.out, theirs = socket.socketpair()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TICK)  # what ``_conn.tune`` sets
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TICK)
        self.events = Events()
        self.peer = Peer(1, 11, theirs, 0.5, self.events)
        self.reader = self.peer.reader
        self.seq = 0

    def frame(self, payload: bytes = b"", kind: int = _wire.KIND_DATA, tag: int = 0, dtype: bytes = b"B",
              nbytes: int | None = None, seq: int | None = None, fp: bytes = _wire.NO_FP) -> bytes:
        n = len(payload) if nbytes is None else nbytes
        header = _wire.pack_header(kind, dtype, tag, self.seq if seq is None else seq, n, fp)
        self.seq += 1
        return header + payload

    def send(self, *frames: bytes) -> None:
        self.out.sendall(b"".join(frames))

    def close(self) -> None:
        self.out.close()
        self.peer.sock.close()


@pytest.fixture
def link() -> Iterator[Link]:
    one = Link()
    yield one
    one.close()


def _post(link: Link, into: np.ndarray, tag: int = 0) -> Any:
    return link.events.matcher.post(memoryview(into).cast("B"), 1, tag, into.dtype)


def test_nothing_there_is_nothing(link: Link) -> None:
    assert link.reader.read_frame(False) == NOTHING
    assert link.peer.state is PeerState.OPEN


def test_a_small_frame_lands_in_its_posted_receive(link: Link) -> None:
    into = np.zeros(4, dtype=np.uint8)
    req = _post(link, into, tag=3)
    link.send(link.frame(b"\x01\x02\x03\x04", tag=3))
    assert link.reader.read_frame(True) == FRAME
    assert isinstance(req, PostedRecv) and req.completed and into.tolist() == [1, 2, 3, 4]


def test_frames_behind_each_other_come_out_of_one_buffer(link: Link) -> None:
    link.send(*(link.frame(bytes([i]) * 10, tag=i) for i in range(5)))
    assert link.reader.read_frame(True) == FRAME
    assert link.reader.has_frame  # the rest arrived with the first read
    link.reader.drain_buffered()
    got = [(u.tag, bytes(u.data)) for u in link.events.matcher.unexpected]
    assert got == [(i, bytes([i]) * 10) for i in range(5)]


def test_a_payload_larger_than_the_buffer_is_read_into_place(link: Link) -> None:
    payload = np.random.default_rng(0).integers(0, 255, 3 * BUFFER_BYTES + 17, dtype=np.uint8)
    into = np.zeros_like(payload)
    req = _post(link, into)
    writer = threading.Thread(target=link.send, args=(link.frame(payload.tobytes()),))
    writer.start()
    assert link.reader.read_frame(True) == FRAME
    writer.join()
    assert req.completed and np.array_equal(into, payload)


def test_a_header_split_across_writes_is_put_together(link: Link) -> None:
    frame = link.frame(b"abc")
    link.send(frame[:10])
    timer = threading.Timer(0.02, link.send, (frame[10:],))
    timer.start()
    assert link.reader.read_frame(True) == FRAME
    timer.join()
    assert bytes(link.events.matcher.unexpected[0].data) == b"abc"


@settings(deadline=None, max_examples=40)
@given(messages=st.lists(st.tuples(st.integers(0, 3), st.binary(max_size=300)), min_size=1, max_size=8),
       cuts=st.lists(st.integers(1, 97), max_size=20))
def test_any_split_of_the_stream_gives_the_same_messages_in_order(messages: list[tuple[int, bytes]],
                                                                   cuts: list[int]) -> None:
    one = Link()
    try:
        stream = b"".join(one.frame(body, tag=tag) for tag, body in messages)
        pieces, pos = [], 0
        for cut in cuts:
            pieces.append(stream[pos:pos + cut])
            pos += cut
        pieces.append(stream[pos:])

        def write() -> None:
            for piece in pieces:
                if piece:
                    one.out.sendall(piece)

        writer = threading.Thread(target=write)
        writer.start()
        for _ in range(1000):  # each read takes a frame, or waits a tick for one
            if len(one.events.matcher.unexpected) == len(messages):
                break
            assert one.reader.read_frame(True) in (FRAME, NOTHING)
        writer.join()
        got = [(u.tag, bytes(u.data)) for u in one.events.matcher.unexpected]
        assert got == messages
        assert one.peer.state is PeerState.OPEN
    finally:
        one.close()


@pytest.mark.parametrize(("frame", "complaint"), [
    (lambda ln: _wire.HEADER.pack(1, b"B", 0x1234, 0, 0, 0, 0, _wire.NO_FP), "bad frame magic 0x1234"),
    (lambda ln: ln.frame(b"", seq=5), "sent frame 5 where 0 was due"),
    (lambda ln: ln.frame(b"", kind=99), "unknown kind 99"),
    (lambda ln: ln.frame(b"", kind=_wire.KIND_HEARTBEAT, nbytes=4), "unknown kind 21"),
    (lambda ln: ln.frame(b"", kind=_wire.KIND_CONTROL, nbytes=MAX_CONTROL_BYTES + 1), "unknown kind 20"),
    (lambda ln: ln.frame(b"", kind=_wire.KIND_PEER_LOST, nbytes=_wire.MAX_LOST_BYTES + 1), "unknown kind 4"),
    (lambda ln: ln.frame(b"", kind=_wire.KIND_MISMATCH, nbytes=3), "unknown kind 3"),
])
def test_a_frame_breaking_the_protocol_breaks_the_stream(link: Link, frame: Any, complaint: str) -> None:
    link.send(frame(link))
    assert link.reader.read_frame(True) == OVER
    assert link.peer.state is PeerState.BROKEN and link.peer.over and not link.peer.left
    kind, message = link.events.seen[0]
    assert kind == "failed" and complaint in message and "rank 11" in message


@settings(deadline=None, max_examples=40)
@given(nbytes=st.integers(MAX_FRAME_BYTES + 1, (1 << 64) - 1))
def test_a_length_beyond_any_buffer_is_refused_before_reading(nbytes: int) -> None:
    one = Link()
    try:
        one.send(one.frame(b"", nbytes=nbytes))
        assert one.reader.read_frame(True) == OVER
        assert one.peer.state is PeerState.BROKEN and "claiming" in one.events.seen[0][1]
    finally:
        one.close()


@settings(deadline=None, max_examples=60)
@given(raw=st.binary(min_size=_wire.HEADER_SIZE, max_size=2 * _wire.HEADER_SIZE))
def test_garbage_never_escapes_the_reader(raw: bytes) -> None:
    """Whatever a stranger writes, reading ends in a frame, nothing yet, or a broken stream
    reported to the channel: never an exception out of ``read_frame``."""
    one = Link()
    try:
        one.send(raw)
        one.out.shutdown(socket.SHUT_WR)
        for _ in range(4):
            got = one.reader.read_frame(True)
            if got == OVER:
                assert one.peer.over and one.events.seen[-1][0] in ("failed", "left")
                break
            assert got in (FRAME, NOTHING)
    finally:
        one.close()


def test_a_refused_payload_is_skipped_and_the_stream_stays_in_step(link: Link) -> None:
    into = np.zeros(2, dtype=np.float32)
    req = _post(link, into)
    link.send(link.frame(bytes(12), dtype=b"f"), link.frame(b"\x07", tag=1))
    assert link.reader.read_frame(True) == FRAME
    with pytest.raises(PeerError, match="12 bytes into a receive buffer of 8"):
        req.wait()
    assert link.reader.read_frame(True) == FRAME
    assert bytes(link.events.matcher.unexpected[0].data) == b"\x07"


def test_the_control_kinds_reach_the_channel(link: Link) -> None:
    notice = _wire.NOTICE.pack(5, 6, b"m" * 32, b"t" * 32)
    lost = _wire.LOST.pack(4) + b"rank 4 died"
    link.send(link.frame(notice, kind=_wire.KIND_MISMATCH, tag=8), link.frame(lost, kind=_wire.KIND_PEER_LOST),
              link.frame(kind=_wire.KIND_PROBE, tag=9, fp=b"p" * 32), link.frame(b"ctl", kind=_wire.KIND_CONTROL),
              link.frame(b"", kind=_wire.KIND_HEARTBEAT))
    for _ in range(5):
        assert link.reader.read_frame(True) == FRAME
    assert link.events.seen == [("mismatch", 8, (5, 6)), ("lost", 4, "rank 4 died"), ("probe", 9, b"p"),
                                ("control", b"ctl")]


def test_a_goodbye_ends_the_peer_as_left(link: Link) -> None:
    link.send(link.frame(b"x"), link.frame(kind=_wire.KIND_GOODBYE))
    assert link.reader.read_frame(True) == FRAME
    assert link.reader.read_frame(True) == OVER
    assert link.peer.state is PeerState.LEFT and link.peer.left and link.events.seen == [("left",)]


def test_eof_without_a_goodbye_is_a_death(link: Link) -> None:
    link.out.close()
    assert link.reader.read_frame(True) == OVER
    assert link.peer.state is PeerState.BROKEN
    assert "closed its connection without a goodbye" in link.events.seen[0][1]


def test_eof_mid_payload_fails_the_receive_being_landed(link: Link) -> None:
    into = np.zeros(3 * BUFFER_BYTES, dtype=np.uint8)
    req = _post(link, into)
    link.send(link.frame(bytes(100), nbytes=into.nbytes))
    link.out.shutdown(socket.SHUT_WR)
    assert link.reader.read_frame(True) == OVER
    assert link.peer.state is PeerState.BROKEN and "rank 11" in link.events.seen[0][1]
    with pytest.raises(PeerError, match="rank 11"):
        req.wait()


def test_eof_while_this_rank_closes_is_no_death(link: Link) -> None:
    assert link.peer.become(PeerState.CLOSING)
    link.out.close()
    assert link.reader.read_frame(True) == OVER
    assert link.peer.state is PeerState.CLOSED and link.events.seen == []


def test_receive_direct_lands_its_tag_and_dispatches_the_others(link: Link) -> None:
    into = np.zeros(2, dtype=np.int32)
    link.send(link.frame(b"zz", tag=4), link.frame(np.array([5, 6], dtype=np.int32).tobytes(), tag=3, dtype=b"i"))
    with link.reader.gate:
        link.reader.receive_direct(memoryview(into).cast("B"), b"i", into.dtype, 3, lambda rank: None)
    assert into.tolist() == [5, 6] and isinstance(link.events.matcher.unexpected[0], Unexpected)
    into2 = np.zeros(2, dtype=np.int32)
    link.send(link.frame(bytes(8), tag=3, dtype=b"f"))
    with link.reader.gate, pytest.raises(InvalidArrayError, match="dtype float32"):
        link.reader.receive_direct(memoryview(into2).cast("B"), b"i", into2.dtype, 3, lambda rank: None)


@settings(deadline=None, max_examples=80)
@given(steps=st.lists(st.sampled_from(list(PeerState)), max_size=8))
def test_a_peer_moves_only_along_the_state_table(steps: list[PeerState]) -> None:
    one = Link()
    try:
        state = PeerState.OPEN
        for new in steps:
            moved = one.peer.become(new)
            assert moved == (new in TRANSITIONS[state])
            state = new if moved else state
            assert one.peer.state is state
        if state.over:
            assert not any(one.peer.become(s) for s in PeerState)  # an end is final
    finally:
        one.close()
