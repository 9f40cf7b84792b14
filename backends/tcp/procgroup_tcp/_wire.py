"""The tcp backend's framing: a fixed 64-byte header, then the raw payload bytes.

The bottom layer: structs and byte views only, no sockets or threads. All lengths are
64-bit, so a single message may exceed 2 GiB. The header's last 32 bytes are the
fingerprint of the op that sent the frame (:class:`procgroup.backend.Fingerprint`,
packed; all zero for user messages), which the receiver compares with its own.
docs/backends/tcp.md draws the wire.
"""

from __future__ import annotations

import struct

import numpy as np
from procgroup.errors import InvalidArrayError, PeerError

MAGIC = 0x5047  # "PG"
VERSION = 4  # 2: the fingerprint in the header, the listener's nonce in the hello; 3: KIND_PROBE; 4: KIND_PEER_LEFT

# kind (u8), dtype char (1 byte), magic (u16), reserved (u32), tag, seq, nbytes (u64 each),
# the op's fingerprint (32 bytes)
HEADER = struct.Struct("<BcHIQQQ32s")
HEADER_SIZE = HEADER.size
FP_SIZE = 32
#: the fingerprint of a user message: its dtype and size are in the header already
NO_FP = bytes(FP_SIZE)

KIND_DATA = 1
KIND_GOODBYE = 2  # the peer is closing cleanly (destroy_process_group / exit)
KIND_MISMATCH = 3  # the peer found a collective's fingerprints disagree (payload: NOTICE)
KIND_PEER_LOST = 4  # the peer lost another rank (payload: LOST + the reason, utf-8)
#: "I have waited a while in the collective of this tag, under this fingerprint" (no payload):
#: lets ranks that disagree while every one of them only receives find it (see ``_match``)
KIND_PROBE = 5
#: "an op of mine failed because rank X left first" (payload: LOST + the reason, utf-8): sent
#: before the goodbye of a rank leaving after that failure, so its peers name X, not it
KIND_PEER_LEFT = 6
KIND_CONTROL = 20  # fault tolerance: revoke and the agreement (payload: the SDK's message)
KIND_HEARTBEAT = 21  # "still alive", no payload (procgroup_tcp._heartbeat)
KINDS = frozenset((KIND_DATA, KIND_GOODBYE, KIND_MISMATCH, KIND_PEER_LOST, KIND_PROBE, KIND_PEER_LEFT,
                   KIND_CONTROL, KIND_HEARTBEAT))
#: a lost-peer or peer-left notice: the world rank it names, then the reason (utf-8)
LOST = struct.Struct("<q")
MAX_LOST_BYTES = 4096

# hello sent by the connecting side after the handshake: magic, version, sender rank,
# channel size, group id, the nonce the listener published in the store
NONCE_SIZE = 16
HELLO = struct.Struct(f"<HHIIQ{NONCE_SIZE}s")
HELLO_SIZE = HELLO.size

# a mismatch notice: the detector's world rank, the sender's world rank, the detector's
# fingerprint, the one the frame carried
NOTICE = struct.Struct(f"<qq{FP_SIZE}s{FP_SIZE}s")
NOTICE_SIZE = NOTICE.size


def pack_lost(rank: int, reason: str) -> bytes:
    """A lost-peer or peer-left notice's body: the world rank, then the reason, cut to fit
    ``MAX_LOST_BYTES`` (at a character boundary)."""
    text = reason.encode("utf-8", "replace")[:MAX_LOST_BYTES - LOST.size].decode("utf-8", "ignore").encode()
    return LOST.pack(rank) + text


def unpack_lost(body: bytes) -> tuple[int, str]:
    """(world rank, reason) of a notice body; ValueError when its size is out of bounds."""
    if not LOST.size <= len(body) <= MAX_LOST_BYTES:
        raise ValueError(f"a notice of {len(body)} bytes (from {LOST.size} to {MAX_LOST_BYTES})")
    (rank,) = LOST.unpack_from(body)
    return rank, body[LOST.size:].decode("utf-8", "replace")


def pack_header(kind: int, dtype_char: bytes, tag: int, seq: int, nbytes: int, fp: bytes = NO_FP) -> bytes:
    return HEADER.pack(kind, dtype_char, MAGIC, 0, tag, seq, nbytes, fp)


def unpack_header(buf: bytes | bytearray | memoryview) -> tuple[int, bytes, int, int, int, bytes]:
    """Returns (kind, dtype_char, tag, seq, nbytes, fp); ValueError on a corrupt header."""
    kind, dtype_char, magic, _, tag, seq, nbytes, fp = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ValueError(f"bad frame magic {magic:#x}: the stream is corrupt or not procgroup's")
    return kind, dtype_char, tag, seq, nbytes, fp


def pack_hello(rank: int, size: int, group_id: int, nonce: bytes) -> bytes:
    return HELLO.pack(MAGIC, VERSION, rank, size, group_id, nonce)


def unpack_hello(buf: bytes, size: int, group_id: int, nonce: bytes) -> int:
    """The connecting peer's rank; ValueError when it is not a peer of this channel."""
    magic, version, rank, their_size, their_group, their_nonce = HELLO.unpack(buf)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a procgroup tcp peer (magic {magic:#x}, version {version})")
    if their_size != size or their_group != group_id:
        raise ValueError(f"peer is from another group (size {their_size}, group {their_group})")
    if their_nonce != nonce:
        raise ValueError("peer read another listener's address: a different job holds this port")
    if not 0 <= rank < size:
        raise ValueError(f"peer claims rank {rank} of a group of {size}")
    return rank


def byte_view(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous NumPy array (writable if it is), no copy.

    ``memoryview(a).cast("B")`` first: a third of the time of reshape + view, and it is
    on every message's path; dtypes the buffer protocol refuses (datetime) take the view."""
    try:
        return memoryview(array).cast("B")
    except (TypeError, ValueError):
        return memoryview(array.reshape(-1).view(np.uint8))


#: dtype -> the one-byte code a frame header carries (filled by ``dtype_code``)
DTYPE_CODES: dict[np.dtype, bytes] = {}


def dtype_code(dtype: np.dtype) -> bytes:
    """The one-byte dtype code a frame header carries (cached: it is on every send)."""
    code = DTYPE_CODES.get(dtype)
    if code is None:
        code = DTYPE_CODES[dtype] = dtype.char.encode()
    return code


def dtype_of(code: bytes) -> np.dtype | bytes:
    """The dtype a frame's code names (the raw code if it names none, for messages)."""
    try:
        return np.dtype(code.decode())
    except (TypeError, ValueError, SyntaxError):  # SyntaxError: numpy parses "," as a record spec
        return code


def check_size(nbytes: int, dtype_char: bytes, view: memoryview, dtype: np.dtype, sender: int) -> None:
    """Refuse a frame whose size or dtype differs from the receive buffer, naming both."""
    if nbytes == view.nbytes and (dtype_char == dtype_code(dtype) or dtype_of(dtype_char) == dtype):
        return
    if nbytes > view.nbytes:
        raise PeerError(f"rank {sender} sent a message of {nbytes} bytes into a receive buffer of "
                        f"{view.nbytes} bytes; size and dtype must match", rank=sender)
    raise InvalidArrayError(
        f"message from rank {sender} has {nbytes} bytes of dtype {dtype_of(dtype_char)!s} but the receive "
        f"buffer has {view.nbytes} bytes of dtype {dtype}; size and dtype must match"
    )


__all__ = [
    "DTYPE_CODES",
    "FP_SIZE",
    "HEADER_SIZE",
    "HELLO_SIZE",
    "KINDS",
    "KIND_CONTROL",
    "KIND_DATA",
    "KIND_GOODBYE",
    "KIND_HEARTBEAT",
    "KIND_MISMATCH",
    "KIND_PEER_LEFT",
    "KIND_PEER_LOST",
    "KIND_PROBE",
    "LOST",
    "MAX_LOST_BYTES",
    "NONCE_SIZE",
    "NOTICE",
    "NOTICE_SIZE",
    "NO_FP",
    "byte_view",
    "check_size",
    "dtype_code",
    "dtype_of",
    "pack_header",
    "pack_lost",
    "pack_hello",
    "unpack_header",
    "unpack_hello",
    "unpack_lost",
]
