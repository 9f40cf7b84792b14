"""The TCPStore wire format: length-prefixed binary frames with 64-bit lengths.

A message is ``!BI`` (op or status, number of fields) followed by each field as a
``!Q`` length and that many bytes. Requests and replies share this layout.
"""

from __future__ import annotations

import enum
import socket
import struct

HEADER = struct.Struct("!BI")
LENGTH = struct.Struct("!Q")
DOUBLE = struct.Struct("!d")

#: Refuse absurd field counts before allocating anything (a stray client, a port scan).
MAX_FIELDS = 1 << 20


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


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Read exactly ``size`` bytes; ConnectionError on EOF."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError("connection closed by the TCPStore server")
        got += n
    return bytes(buf)


def recv_message(sock: socket.socket) -> tuple[int, list[bytes]]:
    """Blocking read of one whole message (client side)."""
    code, n = HEADER.unpack(recv_exact(sock, HEADER.size))
    fields = []
    for _ in range(n):
        (size,) = LENGTH.unpack(recv_exact(sock, LENGTH.size))
        fields.append(recv_exact(sock, size))
    return code, fields
