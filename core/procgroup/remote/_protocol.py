"""The master-worker wire: tags, frames and the error record, shared by both sides.

Everything travels over the world group's point-to-point calls (the job's own,
authenticated transport). Commands go master -> worker on :data:`CMD_TAG` in fixed-size
frames (:data:`FRAME` bytes: a 16-byte header, then a pickled batch of commands; a batch
larger than one frame sends its remainder as one more message). Replies go worker ->
master on a tag of their own per request (:func:`reply_tag`), the same frame layout,
with array data inline when it fits and as one more message of exactly its size when it
does not. Worker -> worker copies (``RemoteArray.to``) and master -> worker copies
(``remote.send``) use a tag per transfer (:func:`transfer_tag`).

A large array bound for a receiver that knows its shape (a ``get``, a ``.to``) travels
*posted* where the backend can withdraw a posted receive (``DataChannel.cancels_recv``):
the receiver allocates the result and posts its receive on :func:`data_tag` before the
sender may send, then reads the sender's frame: VALUE (the data follows straight into the
result) or ERRORS (the receive is withdrawn). Elsewhere the sender's frame goes first and a
large remainder waits for the receiver's READY byte (:func:`send_array`). A large
``remote.send`` needs no cancel (the master's data cannot fail): the master waits for the
node's READY, sent once its receive is posted on :func:`data_tag`, then sends the data.

Commands are pickles and are accepted only from rank 0, the master: an authenticated
member of the job (docs/security.md).
"""

from __future__ import annotations

import enum
import pickle
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Master-worker traffic uses world tags [2**30, 2**31): user tags below stay free.
TAG_BASE = 1 << 30
CMD_TAG = TAG_BASE
HELLO_TAG = TAG_BASE + 1
_REPLY_BASE = TAG_BASE + 16
_XFER_BASE = TAG_BASE + (1 << 28)
_SPAN = 1 << 28
#: the data of a posted transfer: replies and transfers shifted into [2**30 + 2**29, 2**31)
_DATA_OFFSET = 1 << 29

#: Frame size in bytes (commands and replies); the first 16 bytes are the header.
FRAME = 4096
HEADER = struct.Struct("<B7xQ")  # kind, total payload length
INLINE = FRAME - HEADER.size


class FrameKind(enum.IntEnum):
    """The first byte of every frame's header: what the frame carries."""

    COMMANDS = 1  # master -> worker: a pickled batch (list) of commands
    VALUE = 2  # a reply: the data or the pickled value, inline (and its remainder, if any)
    ERRORS = 4  # a reply: a pickled list of ErrorInfo tuples, in place of the value
    VALUE_AFTER_READY = 5  # array data: the remainder follows once the receiver sent READY


class Command(str, enum.Enum):
    """Every command the master sends a worker: the first item of a command tuple.

    What travels is the member's *value*, a plain str (``Command.GET_VALUE.value``): a
    member itself pickles as a reference to this class, which makes every command larger
    and its unpickling slower. The worker's tables are keyed by the members, which hash
    and compare as their values.
    """

    # run on the command's stream, in the order the master issued them
    NEW = "new"  # allocate an array (empty, zeros, ones, full, arange)
    PUT = "put"  # remote.send: the master's array becomes a worker array
    UFUNC = "ufunc"  # a NumPy ufunc call, reduce or accumulate
    FUNCTION = "function"  # a NumPy function (concatenate, where, dot, ...)
    METHOD = "method"  # an array method (sum, astype, fill, ...)
    GET_ITEM = "get_item"  # x[key]
    SET_ITEM = "set_item"  # x[key] = value
    GET_ARRAY = "get_array"  # RemoteArray.get: the data back to the master
    GET_VALUE = "get_value"  # RemoteValue.get: a run() result back to the master
    SEND_TO = "send_to"  # RemoteArray.to: the sending worker's half
    RECV_FROM = "recv_from"  # RemoteArray.to: the receiving worker's half
    TO_DEVICE = "to_device"  # between host and GPU on one worker
    RUN = "run"  # remote.run: a pickled function
    COLLECTIVE = "collective"  # remote.all_reduce / broadcast over the workers
    RECORD_EVENT = "record_event"  # Event.record
    WAIT_EVENT = "wait_event"  # Stream.wait_event
    STREAM_SYNCHRONIZE = "stream_synchronize"  # Stream.synchronize: reply once the stream got here
    STREAM_MARK = "stream_mark"  # worker-internal, never sent: call back when the stream gets here
    # run by the worker's main thread as they arrive
    FREE = "free"  # arrays the master no longer references
    NEW_GROUP = "new_group"  # a process group of some workers (for COLLECTIVE)
    SYNCHRONIZE = "synchronize"  # remote.synchronize: reply once every stream is drained
    MEMORY_INFO = "memory_info"
    EMPTY_CACHE = "empty_cache"
    STREAM_QUERY = "stream_query"  # Stream.query: is the stream idle?
    EVENT_QUERY = "event_query"  # Event.query: was the event reached?
    EVENT_SYNCHRONIZE = "event_synchronize"  # Event.synchronize and Event.elapsed_time
    GOODBYE = "goodbye"  # the master's program ends


#: Array data of at least this many bytes past the frame waits for the receiver's READY
#: (send_array with rendezvous=True): its receive is then posted into the result array
#: before the data moves, so the transport never parks it in an unexpected-message buffer
#: (one more 64 MiB copy) nor in fresh pages twice.
RENDEZVOUS_BYTES = 1 << 20
#: the READY byte's values (the receiver of a posted transfer sends one either way)
READY, NOT_READY = 1, 0


def reply_tag(n: int) -> int:
    return _REPLY_BASE + n % (_SPAN - 16)


def transfer_tag(n: int) -> int:
    return _XFER_BASE + n % _SPAN


def data_tag(tag: int) -> int:
    """Where a posted transfer's data travels: beside ``tag``'s frames, never on them."""
    return tag + _DATA_OFFSET


def posts(channel: Any, nbytes: int) -> bool:
    """A transfer of ``nbytes`` goes posted on this channel (see the module docstring)."""
    return nbytes >= RENDEZVOUS_BYTES and bool(getattr(channel, "cancels_recv", False))


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def byte_view(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (what goes on the wire)."""
    return array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)


def send_payload(channel: Any, buf: np.ndarray, dst: int, tag: int, kind: int, payload: Any) -> None:
    """Send ``payload`` (bytes or a uint8 array) as a frame of ``kind``; what does not
    fit in the frame follows as one more message. ``buf`` is a FRAME-byte scratch array."""
    n = len(payload)
    HEADER.pack_into(buf, 0, kind, n)
    head = min(n, INLINE)
    if head:
        buf[HEADER.size:HEADER.size + head] = np.frombuffer(payload, np.uint8, head)
    channel.send(buf, dst, tag)
    if n > INLINE:
        rest = payload[INLINE:]
        channel.send(rest if isinstance(rest, np.ndarray) else np.frombuffer(rest, np.uint8), dst, tag)


def send_array(channel: Any, buf: np.ndarray, dst: int, tag: int, data: np.ndarray, *, rendezvous: bool) -> None:
    """Send array bytes (a flat uint8 view) as a VALUE frame and its remainder; with
    ``rendezvous`` a large remainder waits until the receiver says its receive is posted
    (recv_array answers VALUE_AFTER_READY). Only where the receiver is already waiting for the
    array (a get, a copy between workers): the master's own sends stay eager."""
    n = data.nbytes
    ready = rendezvous and n - INLINE >= RENDEZVOUS_BYTES
    HEADER.pack_into(buf, 0, FrameKind.VALUE_AFTER_READY if ready else FrameKind.VALUE, n)
    head = min(n, INLINE)
    if head:
        buf[HEADER.size:HEADER.size + head] = data[:head]
    channel.send(buf, dst, tag)
    if n > INLINE:
        if ready:
            channel.recv(buf[:1], dst, tag)
            if buf[0] != READY:
                return  # the receiver could not take the array (it reports why)
        channel.send(data[INLINE:], dst, tag)


def send_posted(channel: Any, buf: np.ndarray, dst: int, tag: int, data: np.ndarray) -> Any:
    """Start sending array bytes (a flat uint8 view) to a receiver whose receive is posted
    on ``data_tag(tag)``: a VALUE frame saying they come, then the bytes themselves (the
    Work returned; ``data`` must stay untouched until it completes)."""
    HEADER.pack_into(buf, 0, FrameKind.VALUE, data.nbytes)
    channel.send(buf, dst, tag)
    return channel.isend(data, dst, data_tag(tag))


def recv_payload(channel: Any, buf: np.ndarray, src: int, tag: int) -> tuple[int, bytes | np.ndarray]:
    """Receive one frame (and its remainder): (kind, payload bytes)."""
    channel.recv(buf, src, tag)
    kind, n = HEADER.unpack_from(buf, 0)
    if n <= INLINE:
        return kind, buf[HEADER.size:HEADER.size + n].tobytes()
    whole = np.empty(n, np.uint8)
    whole[:INLINE] = buf[HEADER.size:]
    channel.recv(whole[INLINE:], src, tag)
    return kind, whole


@dataclass
class ErrorInfo:
    """What failed on a worker: enough to raise :class:`procgroup.RemoteError` on the master."""

    node: int
    rank: int
    op: str
    exc_type: str
    message: str
    traceback: str
    stream: int = 0
    reported: bool = field(default=False, compare=False)

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.node, self.rank, self.op, self.exc_type, self.message, self.traceback, self.stream)


class Ref:
    """A worker array named in a command (its id)."""

    __slots__ = ("id",)

    def __init__(self, id_: int) -> None:
        self.id = id_

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


__all__ = [
    "CMD_TAG", "FRAME", "HEADER", "HELLO_TAG", "INLINE", "NOT_READY", "READY", "RENDEZVOUS_BYTES", "TAG_BASE", "Command", "ErrorInfo", "FrameKind", "Ref", "byte_view", "data_tag", "dumps",
    "posts", "recv_payload", "reply_tag", "send_array", "send_payload", "send_posted", "transfer_tag",
]
