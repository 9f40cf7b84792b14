"""The Store protocol: the TCPStore wire codec, the server's bounded frame reader, and the
Store semantics (HashStore in process, TCPStore with its server on localhost)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.errors import InvalidArgumentError, StoreTimeoutError
from procgroup.rendezvous import HashStore, TCPStore
from procgroup.rendezvous import _wire
from procgroup.rendezvous._wire import HEADER, LENGTH, MAX_KEY_BYTES, FrameError, FrameReader, Op, encode, try_decode

pytestmark = pytest.mark.unit

_fields = st.lists(st.binary(max_size=64), max_size=6)


@given(code=st.sampled_from(list(Op)), fields=_fields)
def test_encode_then_decode_is_the_identity(code: Op, fields: list[bytes]) -> None:
    frame = encode(code, fields)
    assert try_decode(bytearray(frame)) == (code, fields, len(frame))
    assert try_decode(bytearray(frame[:-1])) is None or not fields and len(frame) == HEADER.size


@settings(max_examples=60, deadline=None)
@given(frames=st.lists(st.tuples(st.sampled_from(list(Op)), _fields), min_size=1, max_size=5),
       cuts=st.lists(st.integers(1, 40), max_size=30))
def test_the_frame_reader_reassembles_any_split(frames: list[tuple[Op, list[bytes]]], cuts: list[int]) -> None:
    """However TCP splits the stream, the reader yields the same requests, in order."""
    stream = b"".join(encode(code, fields) for code, fields in frames)
    reader, got, pos = FrameReader(max_value=1 << 20), [], 0
    for cut in cuts:
        got += reader.feed(stream[pos:pos + cut])
        pos += cut
    got += reader.feed(stream[pos:])
    assert got == [(int(code), fields, None) for code, fields in frames]
    assert reader.buffered == 0


def test_an_oversized_value_is_skipped_and_answered_in_step() -> None:
    reader = FrameReader(max_value=8)
    big = encode(Op.SET, [b"key", b"v" * 100])
    small = encode(Op.GET, [b"key", b"1.0"])
    out = reader.feed(big + small)
    assert len(out) == 2
    code, fields, error = out[0]
    assert code == Op.SET and error is not None and "field 1 of a SET request is 100 bytes" in error
    assert _wire.ENV_MAX_VALUE in error
    assert out[1] == (int(Op.GET), [b"key", b"1.0"], None)  # the stream stayed in step
    key_error = reader.feed(encode(Op.GET, [b"k" * (MAX_KEY_BYTES + 1)]))[0][2]
    assert key_error is not None and "key limit" in key_error


def test_protocol_violations_are_frame_errors() -> None:
    with pytest.raises(FrameError, match="unknown request kind 200"):
        FrameReader(16).feed(HEADER.pack(200, 0))
    with pytest.raises(FrameError, match="claims"):
        FrameReader(16).feed(HEADER.pack(int(Op.SET), _wire.MAX_FIELDS + 1))
    with pytest.raises(ValueError, match="claims"):
        try_decode(bytearray(HEADER.pack(0, _wire.MAX_FIELDS + 1)))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_requests_or_a_frame_error(data: bytes) -> None:
    """Nothing a client sends makes the reader raise anything but FrameError, or keep
    more than one capped frame."""
    reader = FrameReader(max_value=64)
    try:
        for code, fields, error in reader.feed(data):
            assert code in set(map(int, Op))
            assert error is not None or all(len(f) <= max(64, MAX_KEY_BYTES) for f in fields)
    except FrameError:
        return
    assert reader.buffered <= len(data)


def test_a_huge_claimed_length_allocates_nothing() -> None:
    reader = FrameReader(max_value=64)
    out = reader.feed(HEADER.pack(int(Op.SET), 2) + LENGTH.pack(3) + b"abc" + LENGTH.pack(1 << 60))
    assert out == [] and reader.buffered == 0  # skipping, not buffering


def test_store_size_caps_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_wire.ENV_MAX_VALUE, raising=False)
    assert _wire.max_value_bytes() == _wire.DEFAULT_MAX_VALUE_BYTES
    monkeypatch.setenv(_wire.ENV_MAX_VALUE, "1024")
    assert _wire.max_value_bytes() == 1024
    monkeypatch.setenv(_wire.ENV_MAX_CLIENT, "0")
    with pytest.raises(InvalidArgumentError, match=_wire.ENV_MAX_CLIENT):
        _wire.max_client_bytes()


def _exercise(store: HashStore | TCPStore) -> None:
    """The Store contract, the same for every Store."""
    store.set("a", b"1")
    store.set("s", "text")
    assert store.get("a") == b"1" and store.get("s") == b"text"
    assert store.add("n", 5) == 5 and store.add("n", -2) == 3 and store.add("n", 0) == 3
    assert store.check(["a", "n"]) and not store.check(["a", "missing"])
    store.wait(["a", "s"], timeout=1.0)
    assert store.compare_set("a", b"1", b"2") == b"2"
    assert store.compare_set("a", b"1", b"3") == b"2"  # expected value wrong: unchanged
    assert store.compare_set("fresh", b"", b"v") == b"v"  # empty expected: create
    assert store.num_keys() >= 4
    assert store.delete_key("a") and not store.delete_key("a")
    with pytest.raises(StoreTimeoutError):
        store.get("missing", timeout=0.2)
    with pytest.raises(StoreTimeoutError):
        store.wait(["missing"], timeout=0.2)


def test_hash_store_contract() -> None:
    with HashStore() as store:
        _exercise(store)


def test_tcp_store_contract_on_localhost() -> None:
    key = b"unit-test-job-key"
    master = TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=10, wait_for_workers=False,
                      job_key=key)
    try:
        master.close_grace = 0
        client = TCPStore("127.0.0.1", master.port, world_size=2, timeout=10, job_key=key)
        try:
            _exercise(client)
            client.set("from-client", b"x")
            assert master.get("from-client") == b"x"  # one server, two connections
        finally:
            client.close()
    finally:
        master.close()


@pytest.mark.parametrize("bad", [dict(port=-1), dict(port=70000), dict(port=True), dict(world_size=0)])
def test_tcp_store_argument_errors(bad: dict[str, object]) -> None:
    args: dict[str, object] = dict(host="127.0.0.1", port=1234, world_size=2, job_key=b"k")
    args.update(bad)
    with pytest.raises(InvalidArgumentError, match="TCPStore: "):
        TCPStore(**args)


def test_a_counter_that_is_not_a_number_is_refused() -> None:
    with HashStore() as store:
        store.set("c", b"not a number")
        with pytest.raises(InvalidArgumentError, match="key 'c' holds b'not a number', which is not an integer"):
            store.add("c", 1)
