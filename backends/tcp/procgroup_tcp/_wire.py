"""The tcp backend's framing: a fixed 32-byte header, then the raw payload bytes.

The bottom layer: structs and byte views only, no sockets or threads. All lengths are
64-bit, so a single message may exceed 2 GiB.
"""

from __future__ import annotations

import struct

import numpy as np

MAGIC = 0x5047  # "PG"
VERSION = 1

# kind (u8), dtype char (1 byte), magic (u16), reserved (u32), tag, seq, nbytes (u64 each)
HEADER = struct.Struct("<BcHIQQQ")
HEADER_SIZE = HEADER.size

KIND_DATA = 1
KIND_GOODBYE = 2  # the peer is closing cleanly (destroy_process_group / exit)

# hello sent by the connecting side: magic, version, sender rank, channel size, group id
HELLO = struct.Struct("<HHIIQ")
HELLO_SIZE = HELLO.size


def pack_header(kind: int, dtype_char: bytes, tag: int, seq: int, nbytes: int) -> bytes:
    return HEADER.pack(kind, dtype_char, MAGIC, 0, tag, seq, nbytes)


def unpack_header(buf: bytes | bytearray | memoryview) -> tuple[int, bytes, int, int, int]:
    """Returns (kind, dtype_char, tag, seq, nbytes); ValueError on a corrupt header."""
    kind, dtype_char, magic, _, tag, seq, nbytes = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ValueError(f"bad frame magic {magic:#x}: the stream is corrupt or not procgroup's")
    return kind, dtype_char, tag, seq, nbytes


def pack_hello(rank: int, size: int, group_id: int) -> bytes:
    return HELLO.pack(MAGIC, VERSION, rank, size, group_id)


def unpack_hello(buf: bytes, size: int, group_id: int) -> int:
    """The connecting peer's rank; ValueError when it is not a peer of this channel."""
    magic, version, rank, their_size, their_group = HELLO.unpack(buf)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a procgroup tcp peer (magic {magic:#x}, version {version})")
    if their_size != size or their_group != group_id:
        raise ValueError(f"peer is from another group (size {their_size}, group {their_group})")
    return rank


def byte_view(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous NumPy array (writable if it is), no copy."""
    return memoryview(array.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


_DTYPE_CODES: dict[np.dtype, bytes] = {}


def dtype_code(dtype: np.dtype) -> bytes:
    """The one-byte dtype code a frame header carries (cached: it is on every send)."""
    code = _DTYPE_CODES.get(dtype)
    if code is None:
        code = _DTYPE_CODES[dtype] = dtype.char.encode()
    return code


def dtype_of(code: bytes) -> np.dtype | bytes:
    """The dtype a frame's code names (the raw code if it names none, for messages)."""
    try:
        return np.dtype(code.decode())
    except (TypeError, ValueError, UnicodeDecodeError):
        return code


__all__ = [
    "HEADER_SIZE",
    "HELLO_SIZE",
    "KIND_DATA",
    "KIND_GOODBYE",
    "byte_view",
    "dtype_code",
    "dtype_of",
    "pack_header",
    "pack_hello",
    "unpack_header",
    "unpack_hello",
]
