"""tcp's wire codecs: the frame header, the hello, size and dtype checks (in process)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procgroup.errors import InvalidArrayError, PeerError
from procgroup_tcp import _wire
from procgroup_tcp._wire import (
    FP_SIZE,
    HEADER_SIZE,
    HELLO_SIZE,
    NONCE_SIZE,
    byte_view,
    check_size,
    dtype_code,
    dtype_of,
    pack_header,
    pack_hello,
    unpack_header,
    unpack_hello,
)

pytestmark = pytest.mark.unit
#: no deadline: the suite may share a loaded machine; a bounded number of examples keeps it fast
_bounded = settings(deadline=None, max_examples=60)

_u64 = st.integers(0, (1 << 64) - 1)


@_bounded
@given(kind=st.integers(0, 255), dtype_char=st.binary(min_size=1, max_size=1), tag=_u64, seq=_u64,
       nbytes=_u64, fp=st.binary(min_size=FP_SIZE, max_size=FP_SIZE))
def test_a_header_reads_back_as_written(kind: int, dtype_char: bytes, tag: int, seq: int, nbytes: int,
                                        fp: bytes) -> None:
    header = pack_header(kind, dtype_char, tag, seq, nbytes, fp)
    assert len(header) == HEADER_SIZE == 64
    assert unpack_header(header) == (kind, dtype_char, tag, seq, nbytes, fp)


@_bounded
@given(raw=st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE))
def test_any_64_bytes_parse_as_a_header_or_fail_with_value_error(raw: bytes) -> None:
    """Bytes from a peer: a header with the wrong magic is refused, never misread."""
    magic = struct.unpack_from("<H", raw, 2)[0]
    if magic == _wire.MAGIC:
        assert unpack_header(raw)[0] == raw[0]
    else:
        with pytest.raises(ValueError, match="magic"):
            unpack_header(raw)


@_bounded
@given(rank=st.integers(0, 63), size=st.integers(1, 64), group=st.integers(0, 1 << 40),
       nonce=st.binary(min_size=NONCE_SIZE, max_size=NONCE_SIZE))
def test_a_hello_of_a_peer_of_this_channel_gives_its_rank(rank: int, size: int, group: int, nonce: bytes) -> None:
    hello = pack_hello(rank, size, group, nonce)
    assert len(hello) == HELLO_SIZE
    if rank < size:
        assert unpack_hello(hello, size, group, nonce) == rank
    else:
        with pytest.raises(ValueError, match="claims rank"):
            unpack_hello(hello, size, group, nonce)


@pytest.mark.parametrize(("change", "message"), [
    ({"size": 5}, "another group"),
    ({"group": 8}, "another group"),
    ({"nonce": b"x" * NONCE_SIZE}, "another listener"),
])
def test_a_hello_from_another_channel_is_refused(change: dict[str, object], message: str) -> None:
    mine = {"size": 4, "group": 7, "nonce": b"n" * NONCE_SIZE}
    theirs = {**mine, **change}
    hello = pack_hello(1, theirs["size"], theirs["group"], theirs["nonce"])  # type: ignore[arg-type]  # dict values: int or bytes
    with pytest.raises(ValueError, match=message):
        unpack_hello(hello, mine["size"], mine["group"], mine["nonce"])  # type: ignore[arg-type]  # dict values: int or bytes


@_bounded
@given(raw=st.binary(min_size=HELLO_SIZE, max_size=HELLO_SIZE))
def test_arbitrary_hello_bytes_are_refused_or_give_a_valid_rank(raw: bytes) -> None:
    try:
        rank = unpack_hello(raw, 4, 0, bytes(NONCE_SIZE))
    except ValueError:
        return
    assert 0 <= rank < 4


def test_check_size_names_both_sides() -> None:
    buf = np.zeros(4, dtype=np.float32)
    view = byte_view(buf)
    check_size(16, dtype_code(buf.dtype), view, buf.dtype, 3)  # exact: accepted
    with pytest.raises(PeerError, match="rank 3 sent a message of 32 bytes into a receive buffer of 16"):
        check_size(32, b"f", view, buf.dtype, 3)
    with pytest.raises(InvalidArrayError, match="8 bytes of dtype float32 but the receive buffer has 16"):
        check_size(8, b"f", view, buf.dtype, 3)
    with pytest.raises(InvalidArrayError, match="dtype int32"):
        check_size(16, b"i", view, buf.dtype, 3)


def test_byte_view_is_a_writable_view_without_a_copy() -> None:
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    view = byte_view(arr)
    assert view.nbytes == 12 and not view.readonly
    view[0:2] = b"\xff\x7f"
    assert arr[0, 0] == 0x7FFF


@pytest.mark.parametrize("dtype", ["f4", "f8", "i1", "i2", "i4", "i8", "u1", "u8", "c8", "?", "f2"])
def test_dtype_codes_name_their_dtype(dtype: str) -> None:
    dt = np.dtype(dtype)
    assert dtype_of(dtype_code(dt)) == dt


@_bounded
@given(code=st.binary(min_size=1, max_size=1))
def test_a_dtype_code_from_a_peer_is_a_dtype_or_itself(code: bytes) -> None:
    got = dtype_of(code)
    assert isinstance(got, np.dtype) or got == code


def test_recv_exact_puts_together_what_comes_in_pieces() -> None:
    import socket
    import threading
    import time

    from procgroup.backend import recv_exact

    a, b = socket.socketpair()
    with a, b:
        def write() -> None:
            for piece in (b"he", b"ll", b"o!"):
                a.sendall(piece)
                time.sleep(0.005)
        writer = threading.Thread(target=write)
        writer.start()
        assert recv_exact(b, 6, time.monotonic() + 5.0) == b"hello!"
        writer.join()


def test_recv_exact_reports_a_close_and_a_deadline() -> None:
    import socket
    import time

    from procgroup._auth import ClosedEarly
    from procgroup.backend import recv_exact

    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"abc")
        with pytest.raises(TimeoutError, match="sent 3 of 8 bytes"):
            recv_exact(b, 8, time.monotonic() + 0.02, peer="rank 3")
        a.close()
        with pytest.raises(ClosedEarly, match="rank 3 closed the connection after 0 of 8"):
            recv_exact(b, 8, peer="rank 3")
