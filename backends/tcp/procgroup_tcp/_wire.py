"""The tcp backend's framing: a fixed 32-byte header, then the raw payload bytes.

All lengths are 64-bit, so a single message may exceed 2 GiB.
"""

from __future__ import annotations

import struct

MAGIC = 0x5047  # "PG"
VERSION = 1

# kind (u8), dtype char (1 byte), magic (u16), reserved (u32), tag, seq, nbytes (u64 each)
HEADER = struct.Struct("<BcHIQQQ")
HEADER_SIZE = HEADER.size

KIND_DATA = 1
KIND_GOODBYE = 2  # the peer is closing cleanly (destroy_process_group / exit)

# hello sent by the connecting side: magic, version, sender rank, channel size, group id
HELLO = struct.Struct("<HHIIQ")


def pack_header(kind: int, dtype_char: bytes, tag: int, seq: int, nbytes: int) -> bytes:
    return HEADER.pack(kind, dtype_char, MAGIC, 0, tag, seq, nbytes)


def unpack_header(buf: bytes | bytearray | memoryview) -> tuple[int, bytes, int, int, int]:
    """Returns (kind, dtype_char, tag, seq, nbytes); ValueError on a corrupt header."""
    kind, dtype_char, magic, _, tag, seq, nbytes = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ValueError(f"bad frame magic {magic:#x}: the stream is corrupt or not procgroup's")
    return kind, dtype_char, tag, seq, nbytes
