"""The TCPStore wire format: length-prefixed binary frames with 64-bit lengths.

A message is ``!BI`` (op or status, number of fields) followed by each field as a
``!Q`` length and that many bytes. Requests and replies share this layout. Every
connection starts with the job-token handshake (:mod:`procgroup._auth`, purpose
``b"store"``) before the first frame.

The server parses requests with :class:`FrameReader`, which bounds everything a peer
can send: the field count, each field's length and the frame's total, so a stray or
hostile client can make the server hold at most one capped frame.
"""

from __future__ import annotations

import enum
import os
import socket
import struct

from procgroup._auth import recv_exact
from procgroup.errors import InvalidArgumentError

HEADER = struct.Struct("!BI")
LENGTH = struct.Struct("!Q")
DOUBLE = struct.Struct("!d")

#: Refuse absurd field counts before allocating anything (a stray client, a port scan).
MAX_FIELDS = 1 << 20
#: Longest key (and any non-value field) a request may carry.
MAX_KEY_BYTES = 1 << 16

ENV_MAX_VALUE = "PROCGROUP_STORE_MAX_VALUE_BYTES"
ENV_MAX_CLIENT = "PROCGROUP_STORE_MAX_CLIENT_BYTES"
#: Default cap on one value (set/compare_set), 64 MiB.
DEFAULT_MAX_VALUE_BYTES = 64 << 20
#: Default cap on the bytes of values one client connection holds in the store, 1 GiB.
DEFAULT_MAX_CLIENT_BYTES = 1 << 30


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise InvalidArgumentError(f"environment variable {name}={raw!r}: expected a positive number of bytes")
    return value


def max_value_bytes() -> int:
    """The cap on one value: $PROCGROUP_STORE_MAX_VALUE_BYTES, default 64 MiB."""
    return _env_bytes(ENV_MAX_VALUE, DEFAULT_MAX_VALUE_BYTES)


def max_client_bytes() -> int:
    """The cap on what one client holds: $PROCGROUP_STORE_MAX_CLIENT_BYTES, default 1 GiB."""
    return _env_bytes(ENV_MAX_CLIENT, DEFAULT_MAX_CLIENT_BYTES)


class Op(enum.IntEnum):
    """Request kinds understood by the server."""

    SET = 1
    GET = 2  # key, timeout
    ADD = 3  # key, amount (decimal ASCII)
    WAIT = 4  # timeout, *keys
    CHECK = 5  # *keys
    COMPARE_SET = 6  # key, expected, desired
    DELETE = 7  # key
    NUM_KEYS = 8
    HELLO = 9  # a client announces itself (counted for wait_for_workers)
    WAIT_WORKERS = 10  # n (decimal ASCII), timeout
    PING = 11


#: Which fields of each request are values (capped by max_value_bytes); the others are
#: keys/numbers (capped by MAX_KEY_BYTES).
VALUE_FIELDS = {int(Op.SET): (1,), int(Op.COMPARE_SET): (1, 2)}
_OPS = frozenset(int(op) for op in Op)


class Status(enum.IntEnum):
    """Reply kinds."""

    OK = 0
    TIMEOUT = 1  # fields: the keys still missing (or the worker count)
    ERROR = 2  # field: message


def encode(code: int, fields: list[bytes]) -> bytes:
    """Serialise one message."""
    parts = [HEADER.pack(code, len(fields))]
    for f in fields:
        parts.append(LENGTH.pack(len(f)))
        parts.append(f)
    return b"".join(parts)


class FrameError(ValueError):
    """The peer broke the protocol; the connection cannot be trusted further."""


class FrameReader:
    """Incremental, bounded request parser (server side).

    ``feed(data)`` returns the complete requests as ``(code, fields, error)``: ``error``
    is a message when the request broke a size cap (its oversized bytes were skipped, not
    kept; the caller answers with that message and the connection stays in step). A
    protocol violation (unknown op, too many fields) raises :class:`FrameError`.
    """

    def __init__(self, max_value: int) -> None:
        self.max_value = max_value
        #: the most bytes of fields one request may make the reader keep
        self.max_frame = 2 * max_value + (16 << 20)
        self._buf = bytearray()
        self._reset()

    def _reset(self) -> None:
        self._code: int | None = None
        self._n = 0
        self._fields: list[bytes] = []
        self._size: int | None = None  # length of the field being read
        self._skip = 0  # bytes of an oversized field still to discard
        self._error: str | None = None
        self._kept = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def _cap(self, index: int) -> tuple[int, str]:
        assert self._code is not None
        if index in VALUE_FIELDS.get(self._code, ()):
            return self.max_value, f"{ENV_MAX_VALUE}={self.max_value}"
        return MAX_KEY_BYTES, f"the key limit of {MAX_KEY_BYTES} bytes"

    def feed(self, data: bytes) -> list[tuple[int, list[bytes], str | None]]:
        out: list[tuple[int, list[bytes], str | None]] = []
        buf = self._buf
        buf += data
        pos = 0
        while True:
            if self._skip:
                take = min(self._skip, len(buf) - pos)
                pos += take
                self._skip -= take
                if self._skip:
                    break
                self._fields.append(b"")
                self._size = None
            elif self._code is None:
                if len(buf) - pos < HEADER.size:
                    break
                code, n = HEADER.unpack_from(buf, pos)
                pos += HEADER.size
                if code not in _OPS:
                    del buf[:pos]
                    raise FrameError(f"unknown request kind {code}")
                if n > MAX_FIELDS:
                    del buf[:pos]
                    raise FrameError(f"request claims {n} fields (at most {MAX_FIELDS})")
                self._code, self._n = code, n
            elif len(self._fields) == self._n:
                out.append((self._code, self._fields, self._error))
                self._reset()
            elif self._size is None:
                if len(buf) - pos < LENGTH.size:
                    break
                (size,) = LENGTH.unpack_from(buf, pos)
                pos += LENGTH.size
                cap, what = self._cap(len(self._fields))
                if size <= cap and self._kept + size > self.max_frame:
                    cap, what = self.max_frame - self._kept, f"the request limit of {self.max_frame} bytes"
                if size > cap or self._error is not None:
                    if self._error is None:
                        self._error = (f"field {len(self._fields)} of a {Op(self._code).name} request "
                                       f"is {size} bytes, over {what}")
                    self._skip = size
                    if size == 0:
                        self._fields.append(b"")
                else:
                    self._kept += size
                    self._size = size
            else:
                if len(buf) - pos < self._size:
                    break
                self._fields.append(bytes(buf[pos:pos + self._size]))
                pos += self._size
                self._size = None
        del buf[:pos]
        return out


def try_decode(buf: bytearray) -> tuple[int, list[bytes], int] | None:
    """Parse one message from the front of ``buf``; None if incomplete.

    Returns (code, fields, bytes consumed). Raises ValueError on a malformed header.
    """
    if len(buf) < HEADER.size:
        return None
    code, n = HEADER.unpack_from(buf, 0)
    if n > MAX_FIELDS:
        raise ValueError(f"message claims {n} fields")
    pos = HEADER.size
    fields: list[bytes] = []
    for _ in range(n):
        if len(buf) < pos + LENGTH.size:
            return None
        (size,) = LENGTH.unpack_from(buf, pos)
        pos += LENGTH.size
        if len(buf) < pos + size:
            return None
        fields.append(bytes(buf[pos : pos + size]))
        pos += size
    return code, fields, pos


_SERVER = "the TCPStore server"
#: A reply larger than this is a broken server (values are capped well below it).
MAX_REPLY_FIELD = 1 << 40


def recv_message(sock: socket.socket) -> tuple[int, list[bytes]]:
    """Blocking read of one whole message (client side); ConnectionError on EOF."""
    code, n = HEADER.unpack(recv_exact(sock, HEADER.size, peer=_SERVER))
    if n > MAX_FIELDS:
        raise ConnectionError(f"TCPStore server sent a reply of {n} fields")
    fields = []
    for _ in range(n):
        (size,) = LENGTH.unpack(recv_exact(sock, LENGTH.size, peer=_SERVER))
        if size > MAX_REPLY_FIELD:
            raise ConnectionError(f"TCPStore server sent a reply field of {size} bytes")
        fields.append(recv_exact(sock, size, peer=_SERVER))
    return code, fields
