"""One single-producer, single-consumer ring of records in shared memory (one per ordered pair).

A ring lives in its receiver's inbox segment: a 4 KiB control block, then ``capacity``
bytes of records. The sender owns the ``tail`` counter, the receiver the ``head``
counter and the rendezvous acknowledgement slots; each counter sits on its own cache
line and only ever grows. A record is written in full before the tail moves past it,
and read in full before the head moves past it: on x86-64 stores are seen in program
order (TSO), which is all this needs (the same rule the arena in ``_shm`` relies on).

Records never wrap: one that does not fit before the end of the ring is preceded by a
PAD record that sends the reader back to offset 0. A record that would leave less than a
header before the end takes those last bytes too (writer and reader both skip them), so
a PAD always has room. Every field read from the ring is checked against the ring's own
bounds before it is used (:class:`RingReader.next`).
"""

from __future__ import annotations

import struct
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

_perf = time.perf_counter

#: the control block: tail (sender) at 0, head (receiver) at 64, ack slots from 128, the
#: sender's "waiting for space" flag at 2560 (after the last ack slot, a cache line of its own)
CTRL_BYTES = 4096
_TAIL_WORD, _HEAD_WORD, _ACK_WORD, _WAITS_WORD = 0, 8, 16, 320
#: outstanding rendezvous sends per ordered pair (their acknowledgement slots)
ACK_SLOTS = 256

# kind u8 | dtype char | reserved u16 | record length u32 | tag (MORE: chunk offset) u64 |
# message bytes u64 | fingerprint 32 B
RECORD = struct.Struct("<BcHIQQ32s")
HEADER_BYTES = RECORD.size
# a rendezvous record's body: the sender's buffer address and the send's number
RTS = struct.Struct("<QQ")
#: a small message's payload is packed with its header (``RingWriter.put_small``) and unpacked
#: with it (``RingReader.take_small``) by a struct of its size: one call each, where memoryview
#: slices cost several times as much
SMALL_BYTES = 4096
# payload bytes -> (header + payload, span), filled on first use
_RECORDS: dict[int, tuple[struct.Struct, int]] = {}
# payload bytes -> (header without its fingerprint + payload: what a direct receive reads, as
# it expects none; payload alone; span)
_TAKES: dict[int, tuple[struct.Struct, struct.Struct, int]] = {}


def _record_struct(n: int) -> tuple[struct.Struct, int]:
    got = _RECORDS[n] = (struct.Struct(f"<BcHIQQ32s{n}s"), (HEADER_BYTES + n + 7) & ~7)
    return got


def _take_structs(n: int) -> tuple[struct.Struct, struct.Struct, int]:
    got = _TAKES[n] = (struct.Struct(f"<BcHIQQ32x{n}s"), struct.Struct(f"{n}s"), (HEADER_BYTES + n + 7) & ~7)
    return got


K_PAD = 1  # nothing here: go on at offset 0
K_EAGER = 2  # a whole message
K_FIRST = 3  # the first chunk of a message streamed through the ring
K_MORE = 4  # a later chunk; the tag field holds its offset in the message
K_RTS = 5  # rendezvous: read the message from the sender's memory, then acknowledge
_KINDS = (K_EAGER, K_FIRST, K_MORE, K_RTS)

#: acknowledgement words: (send number + 1) << 2 | status (0: nothing acknowledged yet)
ACK_OK, ACK_REFUSED = 1, 2


def ring_bytes(capacity: int) -> int:
    """The bytes one ring takes in an inbox segment."""
    return CTRL_BYTES + capacity


def _span(reclen: int) -> int:
    """A record's length rounded up to 8 bytes: where the next one starts."""
    return (reclen + 7) & ~7


def _next_start(end: int, capacity: int) -> int:
    """Where the record after one ending at offset ``end`` starts: the end of the ring
    (offset 0 then) when fewer bytes than a header (a PAD's minimum) are left."""
    return capacity if capacity - end < HEADER_BYTES else end


def _layout(pos: int, span: int, capacity: int) -> tuple[bool, int]:
    """(a PAD first, the bytes taken from ``pos`` on) of a record of ``span`` bytes."""
    pad = pos + span > capacity
    start = 0 if pad else pos
    return pad, (capacity - pos if pad else 0) + _next_start(start + span, capacity) - start


class RingCorrupt(ValueError):
    """A record that breaks the ring's rules: the peer (or the memory) cannot be trusted."""


class RingWriter:
    """The sender's end: writes records, reads the head and the acknowledgements."""

    def __init__(self, buf: memoryview, base: int, capacity: int) -> None:
        self.capacity = capacity
        self._words = buf[base : base + CTRL_BYTES].cast("Q")
        self._data = buf[base + CTRL_BYTES : base + CTRL_BYTES + capacity]
        self._tail = self._words[_TAIL_WORD]
        self._head = self._words[_HEAD_WORD]

    def free_for(self, payload: int) -> int:
        """The bytes this record would take (pad included) when it fits now, else 0."""
        _, need = _layout(self._tail % self.capacity, _span(HEADER_BYTES + payload), self.capacity)
        if self._tail + need - self._head > self.capacity:
            self._head = self._words[_HEAD_WORD]
            if self._tail + need - self._head > self.capacity:
                return 0
        return need

    def write(
        self, kind: int, dtype_char: bytes, tag: int, nbytes: int, fp: bytes, payload: memoryview | bytes, need: int
    ) -> None:
        """Write one record of ``payload`` (``need`` from :meth:`free_for`) and publish it."""
        pos = self._tail % self.capacity
        data = self._data
        if _layout(pos, _span(HEADER_BYTES + len(payload)), self.capacity)[0]:
            RECORD.pack_into(data, pos, K_PAD, b"B", 0, self.capacity - pos, 0, 0, b"")
            pos = 0
        n = len(payload)
        RECORD.pack_into(data, pos, kind, dtype_char, 0, HEADER_BYTES + n, tag, nbytes, fp)
        if n:
            data[pos + HEADER_BYTES : pos + HEADER_BYTES + n] = payload
        self._tail += need
        self._words[_TAIL_WORD] = self._tail  # after the record: the reader may take it now

    def put(self, kind: int, dtype_char: bytes, tag: int, fp: bytes, payload: memoryview) -> bool:
        """Write one whole message as one record when it fits now (False: it does not);
        :meth:`free_for` and :meth:`write` in one call, for the small messages' path."""
        cap = self.capacity
        tail = self._tail
        pos = tail % cap
        n = len(payload)
        span = (HEADER_BYTES + n + 7) & ~7
        pad = pos + span > cap
        start = 0 if pad else pos
        end = start + span
        need = (cap - pos if pad else 0) + (cap if cap - end < HEADER_BYTES else end) - start
        if tail + need - self._head > cap:
            self._head = self._words[_HEAD_WORD]
            if tail + need - self._head > cap:
                return False
        data = self._data
        if pad:
            RECORD.pack_into(data, pos, K_PAD, b"B", 0, cap - pos, 0, 0, b"")
        RECORD.pack_into(data, start, kind, dtype_char, 0, HEADER_BYTES + n, tag, n, fp)
        if n:
            data[start + HEADER_BYTES : start + HEADER_BYTES + n] = payload
        self._tail = tail + need
        self._words[_TAIL_WORD] = tail + need  # after the record: the reader may take it now
        return True

    def put_small(self, dtype_char: bytes, tag: int, fp: bytes, payload: bytes) -> bool:
        """:meth:`put` of an eager message of at most ``SMALL_BYTES`` given as bytes: header
        and payload packed in one call (the 8 B message's path). A record that needs a pad,
        or ends too near the ring's end for a header after it, goes through :meth:`put`."""
        n = len(payload)
        st, span = _RECORDS.get(n) or _record_struct(n)
        tail = self._tail
        cap = self.capacity
        pos = tail % cap
        if cap - pos - span < HEADER_BYTES:  # a pad first, or the ring's last bytes taken too
            return self.put(K_EAGER, dtype_char, tag, fp, payload)  # type: ignore[arg-type]  # bytes slices as a view does
        tail += span
        if tail - self._head > cap:
            self._head = self._words[_HEAD_WORD]
            if tail - self._head > cap:
                return False
        st.pack_into(self._data, pos, K_EAGER, dtype_char, 0, HEADER_BYTES + n, tag, n, fp, payload)
        self._tail = tail
        self._words[_TAIL_WORD] = tail  # after the record: the reader may take it now
        return True

    def waiting(self, flag: bool) -> None:
        """Tell the reader whether this sender waits for ring space (it then rings the
        sender's doorbell as it frees some; otherwise a drain of small records does not)."""
        self._words[_WAITS_WORD] = int(flag)

    def ack(self, slot: int) -> int:
        return self._words[_ACK_WORD + slot]

    def release(self) -> None:
        self._words.release()
        self._data.release()


class RingReader:
    """The receiver's end: reads records in order, moves the head, writes acknowledgements."""

    def __init__(self, buf: memoryview, base: int, capacity: int) -> None:
        self.capacity = capacity
        self._words = buf[base : base + CTRL_BYTES].cast("Q")
        self.data = buf[base + CTRL_BYTES : base + CTRL_BYTES + capacity]
        self.head = self._words[_HEAD_WORD]
        self._tail = self._words[_TAIL_WORD]

    def has_record(self) -> bool:
        if self._tail != self.head:
            return True
        self._tail = self._words[_TAIL_WORD]
        return self._tail != self.head

    def spin(self, seconds: float) -> bool:
        """Poll the tail word for up to ``seconds`` until a record is published: True when
        one is. The clock is read once per four polls: a clock read costs more than a poll
        (a system call in some virtual machines), and a record is seen sooner."""
        head = self.head
        if self._tail != head:
            return True
        words = self._words
        end = _perf() + seconds
        while True:
            if words[_TAIL_WORD] != head or words[_TAIL_WORD] != head or words[_TAIL_WORD] != head:
                break
            tail = words[_TAIL_WORD]
            if tail != head:
                self._tail = tail
                return True
            if _perf() >= end:
                return False
        self._tail = words[_TAIL_WORD]
        return True

    def next(self) -> tuple[int, bytes, int, int, bytes, int, int]:
        """(kind, dtype char, tag, message bytes, fingerprint, payload offset, payload bytes)
        of the next record; call :meth:`consume` once its payload has been copied."""
        pos = self.head % self.capacity
        avail = self._tail - self.head
        if avail > self.capacity or avail < 0:
            raise RingCorrupt(f"the ring's counters are inconsistent (head {self.head}, tail {self._tail})")
        if pos + HEADER_BYTES > self.capacity:
            raise RingCorrupt(f"a record at offset {pos} would cross the end of the ring")
        kind, dtype_char, _, reclen, tag, nbytes, fp = RECORD.unpack_from(self.data, pos)
        if kind == K_PAD:
            if reclen != self.capacity - pos or reclen > avail:
                raise RingCorrupt(f"a pad record of {reclen} bytes at offset {pos}")
            self.head += reclen
            if not self.has_record():
                raise RingCorrupt("a pad record with nothing after it")
            return self.next()
        if kind not in _KINDS or reclen < HEADER_BYTES or pos + reclen > self.capacity or _span(reclen) > avail:
            raise RingCorrupt(f"a record of kind {kind} and {reclen} bytes at offset {pos} ({avail} bytes published)")
        return kind, dtype_char, tag, nbytes, fp, pos + HEADER_BYTES, reclen - HEADER_BYTES

    def take_small(self, tag: int, dtype_char: bytes, into: Buffer, n: int, seconds: float = 0.0) -> int:
        """Copy the next record into ``into`` (a writable contiguous buffer of ``n`` bytes,
        at most ``SMALL_BYTES``) and consume it, when it is an eager message of tag ``tag``,
        dtype ``dtype_char`` and exactly ``n`` bytes: 1 (2 when the sender waits for ring
        space). 0 when there is no record, or the next one is anything else (a pad, another
        tag or size, a broken record): it stays, for :meth:`next` to read and judge.

        With ``seconds``, it first polls the tail word up to that long for a record (as
        :meth:`spin`), everything but the record's own checks done before: a waiting
        receiver's work between the record's arrival and its return is the least it can be."""
        head = self.head
        tail = self._tail
        cap = self.capacity
        pos = head % cap
        st, pl, span = _TAKES.get(n) or _take_structs(n)
        end = pos + span
        nxt = head + (cap if cap - end < HEADER_BYTES else end) - pos  # the head once it is taken
        words = self._words
        if tail == head:
            tail = words[_TAIL_WORD]
            if tail == head:
                if not seconds:
                    return 0
                deadline = _perf() + seconds
                while True:  # the clock once per four polls, as spin()
                    if words[_TAIL_WORD] != head or words[_TAIL_WORD] != head or words[_TAIL_WORD] != head:
                        tail = words[_TAIL_WORD]
                        break
                    tail = words[_TAIL_WORD]
                    if tail != head:
                        break
                    if _perf() >= deadline:
                        return 0
            self._tail = tail
        # the record must lie inside the ring and inside what was published: else next() judges it
        if pos + span > cap or span > tail - head or tail - head > cap:
            return 0
        kind, dchar, _, reclen, rtag, nbytes, payload = st.unpack_from(self.data, pos)
        if kind != K_EAGER or rtag != tag or nbytes != n or reclen != HEADER_BYTES + n or dchar != dtype_char:
            return 0
        pl.pack_into(into, 0, payload)
        self.head = nxt
        words[_HEAD_WORD] = nxt
        return 2 if words[_WAITS_WORD] else 1

    def consume(self, payload_at: int, payload_len: int) -> None:
        """The record whose payload starts at ``payload_at`` is done: give its space back."""
        end = _next_start(_span(payload_at + payload_len), self.capacity)
        self.head += end - self.head % self.capacity
        self._words[_HEAD_WORD] = self.head

    def ack(self, slot: int, value: int) -> None:
        self._words[_ACK_WORD + slot] = value

    def writer_waits(self) -> bool:
        """The sender waits for ring space (:meth:`RingWriter.waiting`)."""
        return self._words[_WAITS_WORD] != 0

    def release(self) -> None:
        self._words.release()
        self.data.release()


__all__ = [
    "ACK_OK",
    "ACK_REFUSED",
    "ACK_SLOTS",
    "CTRL_BYTES",
    "HEADER_BYTES",
    "K_EAGER",
    "K_FIRST",
    "K_MORE",
    "K_RTS",
    "RTS",
    "SMALL_BYTES",
    "RingCorrupt",
    "RingReader",
    "RingWriter",
    "ring_bytes",
]
