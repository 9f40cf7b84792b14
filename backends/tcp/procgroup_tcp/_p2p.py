"""Point-to-point between ranks on one host through shared memory (MPICH nemesis's model).

Each rank owns an *inbox*: one file in /dev/shm (0600, an unguessable name) holding one
ring (``_ring``) per same-host peer, which that peer writes and this rank reads. A
message of at most ``EAGER_BYTES`` travels inside one record (copied in by the sender,
out by the receiver). A larger one, up to ``STREAM_MAX_BYTES`` while each of the host's
ranks has a core, is streamed through the ring in chunks (two copies, pipelined); above
that, or when the ranks outnumber the cores, it goes by *rendezvous*: the sender
publishes its buffer's address and the receiver copies it straight into the posted
buffer with ``process_vm_readv`` (``_cma``), then acknowledges. Where the kernel refuses
that copy, every large message streams.

Progress is made by whichever thread waits: every wait of the channel (a receive, a
send waiting for ring space or an acknowledgement, the arena's collectives) drains
every inbox ring into the matcher, in ring order, so per-pair order is kept and an
any-source receive hears shm peers and socket peers alike. A rendezvous nobody has
posted a receive for yet is pulled into the unexpected queue at once, so two ranks
sending large messages to each other never deadlock.

Set-up (:func:`open_p2p`, collective) exchanges the inbox names over the authenticated
sockets, tests the rendezvous copy per pair, and unlinks every inbox once all of its
writers have mapped it: nothing stays in /dev/shm, even after a crash. A pair uses
shared memory only when both ends mapped each other's inbox; every other pair (ranks
on other hosts, PROCGROUP_TCP_SHM=0, PROCGROUP_TCP_SHM_P2P=0) stays on the sockets.
"""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import logging
import mmap
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from procgroup.backend import CompletedWork, Work, env_bytes, env_count, env_flag, fresh
from procgroup.backend._recorder import SLOW_S as _SLOW_S
from procgroup.backend._recorder import waiting as _recorder_waiting
from procgroup.errors import ChannelClosedError, CommTimeoutError, PeerError

from . import _cma
from ._conn import Landing, Peer
from ._doorbell import BLOCK_BYTES, NAP_S, SLEEPERS_WORD, Doorbell
from ._match import Matcher, PostedRecv, Progress
from ._ring import (
    ACK_OK,
    ACK_REFUSED,
    ACK_SLOTS,
    K_EAGER,
    K_FIRST,
    K_MORE,
    K_RTS,
    RTS,
    SMALL_BYTES,
    RingCorrupt,
    RingReader,
    RingWriter,
    ring_bytes,
)
from ._shm import host_identity, shm_possible
from ._wire import DTYPE_CODES, NO_FP, byte_view, check_size, dtype_code

log = logging.getLogger(__name__)

#: PROCGROUP_TCP_SHM_P2P=0 (or the channel option ``shm_p2p=False``) keeps p2p on the sockets.
ENV_SHM_P2P = "PROCGROUP_TCP_SHM_P2P"
#: PROCGROUP_TCP_SHM_CMA=0 (option ``shm_cma=False``): no rendezvous copy out of the sender's
#: memory; large messages stream through the ring (what a kernel that forbids it gets)
ENV_SHM_CMA = "PROCGROUP_TCP_SHM_CMA"
#: PROCGROUP_TCP_SHM_CORES=N (option ``shm_cores``): the cores this host's ranks share, where the
#: process's affinity overstates them (a container's CPU quota leaves the affinity whole); it
#: decides whether each rank has a core (``STREAM_MAX_BYTES``, the spins). Default: the affinity
ENV_SHM_CORES = "PROCGROUP_TCP_SHM_CORES"
#: bytes of records per ordered pair
RING_BYTES = 1 << 20
#: messages up to this size travel inside one ring record (a waiting receive takes it
#: straight from the ring); larger ones are streamed in chunks or go by rendezvous. A
#: message streamed in one chunk costs a send job, a doorbell ring and a posted receive
#: more, several times the copies' time at this size (docs/performance.md)
EAGER_BYTES = 128 * 1024
#: the piece size of a message streamed through the ring
CHUNK_BYTES = 256 * 1024
#: a larger message goes by rendezvous (one ``process_vm_readv`` copy) where it may; up to
#: this size it streams through the ring while this host's ranks each have a core: two
#: copies, but the sender's and the receiver's overlap, and one ``process_vm_readv``
#: (which pins the sender's pages one by one) is slower than that up to here; above it the
#: split copy (``SPLIT_READ_BYTES``) is as fast or faster, and it needs no other process to
#: run alongside, where streaming slows down most when the cores are busy
#: (docs/performance.md); with more ranks than cores the single copy costs less CPU
STREAM_MAX_BYTES = 8 << 20
#: PROCGROUP_TCP_SHM_STREAM_MAX_BYTES (option ``shm_stream_max_bytes``) sets it, 0: never stream
#: where the rendezvous copy may be made
ENV_SHM_STREAM_MAX = "PROCGROUP_TCP_SHM_STREAM_MAX_BYTES"
#: a rendezvous copy of at least this many bytes is split in two, the second half read by a
#: helper thread at the same time (the GIL is released in the system call), while this host's
#: ranks each have a core: its sender sleeps meanwhile, so the two copies have both cores.
#: PROCGROUP_TCP_SHM_SPLIT_BYTES (option ``shm_split_bytes``) sets it, 0: never split
SPLIT_READ_BYTES = 4 << 20
ENV_SHM_SPLIT = "PROCGROUP_TCP_SHM_SPLIT_BYTES"
#: a wait for a large message (sent or received) spins up to this long per byte before it
#: sleeps on the doorbell, when this host's ranks each have a core: the other side is busy
#: copying about that long, and a sleeper's wake-up costs more than the spin ...
SPIN_S_PER_BYTE = 0.5e-9
#: ... and never longer than this (a blocking wait has nothing else to do meanwhile)
MAX_SPIN_S = 5e-3
#: a message claiming more is a protocol error (the sockets' bound)
MAX_MESSAGE_BYTES = 1 << 48
#: the tag of the set-up messages on the sockets (above every tag a user or collective has)
SETUP_TAG = (1 << 64) - 2

_MAGIC = b"PGP2"
_VERSION = 2  # 2: the ring's "sender waits for space" word
# round 1: magic, version, pid, inbox bytes, offset of the receiver's ring in it, the probe's
# address, the probe's bytes, the inbox name
_HELLO = struct.Struct(f"<4sIQQQQ{_cma.PROBE_BYTES}s64s")
# round 2: magic, "I mapped your inbox", "I can read your memory"
_MAPPED = struct.Struct("<4sII")
_NAME = re.compile(r"procgroup-p2p-[0-9]+-[0-9a-f]{32}")
#: rendezvous buffers of sends a close left unacknowledged: a receiver may still read them
_ORPHANS: list[memoryview] = []
#: what an acknowledged rendezvous send holds instead of its buffer
_NO_VIEW = memoryview(b"")


def p2p_wanted(options: Mapping[str, Any] | None) -> bool:
    """This rank allows shared-memory p2p (PROCGROUP_TCP_SHM and PROCGROUP_TCP_SHM_P2P)."""
    return shm_possible(options) and env_flag(ENV_SHM_P2P, True, name="shm_p2p", options=options)


def usable_cores(options: Mapping[str, Any] | None = None) -> int:
    """The cores this host's ranks may run on: PROCGROUP_TCP_SHM_CORES (option ``shm_cores``)
    when set, else this process's affinity (taskset, a container's cpuset)."""
    cores = env_count(ENV_SHM_CORES, None, minimum=1, name="shm_cores", options=options, unit="cores")
    if cores is not None:
        return cores
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------- sends
class SendJob(Work):
    """A send that did not complete at once: queued behind others, waiting for ring
    space, streamed in chunks, or a rendezvous waiting for its acknowledgement."""

    op = "isend"

    def __init__(self, engine: ShmP2P, link: OutLink, view: memoryview, tag: int, dtype_char: bytes, fp: bytes) -> None:
        self.engine = engine
        self.link = link
        self.view = view
        self.tag = tag
        self.dtype_char = dtype_char
        self.fp = fp
        n = view.nbytes
        self.rts = n > EAGER_BYTES and link.cma and n > engine.stream_max
        self.stream = n > EAGER_BYTES and not self.rts
        self.offset = 0
        self.written = False
        self.rts_id = -1
        self.error: BaseException | None = None

    def advance(self) -> bool:
        """Write what fits now (under the link's lock); True once every record is out."""
        w = self.link.writer
        n = self.view.nbytes
        if self.rts:
            link = self.link
            rts_id = link.rts_next
            slot = rts_id % ACK_SLOTS
            held = link.rts_pending.get(slot)
            if held is not None and not held.finished():
                return False
            need = w.free_for(RTS.size)
            if not need:
                w.waiting(True)
                return False
            link.rts_next += 1
            self.rts_id = rts_id
            link.rts_pending[slot] = self
            w.write(K_RTS, self.dtype_char, self.tag, n, self.fp, RTS.pack(_cma.address_of(self.view), rts_id), need)
        elif self.stream:
            while self.offset < n:
                piece = min(CHUNK_BYTES, n - self.offset)
                need = w.free_for(piece)
                if not need:
                    w.waiting(True)
                    return False
                lo = self.offset
                if lo == 0:
                    w.write(K_FIRST, self.dtype_char, self.tag, n, self.fp, self.view[:piece], need)
                else:
                    w.write(K_MORE, self.dtype_char, lo, n, NO_FP, self.view[lo : lo + piece], need)
                self.offset = lo + piece
        else:
            need = w.free_for(n)
            if not need:
                w.waiting(True)
                return False
            w.write(K_EAGER, self.dtype_char, self.tag, n, self.fp, self.view, need)
        self.written = True
        return True

    def finished(self) -> bool:
        if self.error is not None:
            return True
        if not self.written:
            return False
        if not self.rts:
            return True
        if self.link.writer.ack(self.rts_id % ACK_SLOTS) >> 2 != self.rts_id + 1:  # 0: never acknowledged
            return False
        # the receiver has copied it: let go of the caller's buffer (rts_pending keeps this
        # job until its slot comes round again, which would hold the memory of the last
        # ACK_SLOTS large sends of the link alive)
        self.view = _NO_VIEW
        return True

    def fail(self, exc: BaseException) -> None:
        if not self.finished():
            self.error = exc

    def is_completed(self) -> bool:
        if not self.finished():
            self.engine.progress()
        return self.finished()

    def wait(self, timeout: float | None = None) -> bool:
        if not self.finished():
            self.engine.wait_send(self, timeout)
        if self.error is not None:
            raise fresh(self.error)
        return True

    def exception(self) -> BaseException | None:
        return self.error if self.finished() else None

    def _await_limit(self) -> float:
        return self.engine.timeout  # ``await`` polls as long as a blocking wait() waits


class OutLink:
    """This rank's end of the ring it writes in a peer's inbox (and that peer's doorbell)."""

    def __init__(self, rank: int, global_rank: int, writer: RingWriter, bell: Doorbell, cma: bool) -> None:
        self.rank = rank
        self.global_rank = global_rank
        self.writer = writer
        self.bell = bell
        self.cma = cma  # the peer can read our memory: large messages go by rendezvous
        self.lock = threading.Lock()
        self.queue: collections.deque[SendJob] = collections.deque()
        self.rts_next = 0
        self.rts_pending: dict[int, SendJob] = {}


class InLink:
    """This rank's end of the ring a peer writes in our inbox."""

    def __init__(self, rank: int, global_rank: int, reader: RingReader, pid: int) -> None:
        self.rank = rank
        self.global_rank = global_rank
        self.reader = reader
        self.pid = pid
        #: a message streamed in chunks, part-way: [landing, its buffer or None (refused), offset, bytes]
        self.stream: list[Any] | None = None


# ---------------------------------------------------------------------------- the engine
class ShmP2P:
    """The same-host links of one channel and the progress engine that drives them.

    ``check()`` raises when the channel is closed or broken, ``left(rank)`` is the error
    of a send to a peer that said goodbye (None while it has not), ``match(src, tag, nbytes, dtype_char, fp)`` is the
    channel's matcher entry (fingerprints compared there), ``corrupt(rank, exc)``
    breaks the channel when a ring breaks its rules.
    """

    def __init__(
        self,
        maps: list[mmap.mmap],
        views: list[memoryview],
        bell: Doorbell,
        out: dict[int, OutLink],
        inbound: dict[int, InLink],
        timeout: float,
        check: Callable[[], None],
        left: Callable[[int], BaseException | None],
        match: Callable[[int, int, int, bytes, bytes], Landing],
        corrupt: Callable[[int, BaseException], None],
        cores: int | None = None,
        split_bytes: int = SPLIT_READ_BYTES,
        stream_max: int = STREAM_MAX_BYTES,
    ) -> None:
        self._maps = maps
        self._views = views
        self.bell = bell  # this rank's own: peers ring it
        # spin a little before sleeping, unless the ranks of this host outnumber its cores
        self.own_cores = len(out) + 1 <= (usable_cores() if cores is None else cores)
        self._spin = 100e-6 if self.own_cores else 5e-6
        self.out = out
        self.inbound = inbound
        self._in_list = list(inbound.values())
        self._out_list = list(out.values())
        self.timeout = timeout
        self._check = check
        self._left = left
        self._match = match
        self._corrupt = corrupt
        self._rlock = threading.Lock()  # one reader of the inbox rings at a time
        self._closed = False
        self._copier: concurrent.futures.ThreadPoolExecutor | None = None  # the split copy's helper
        #: a rendezvous copy this large is split (never when the ranks outnumber the cores)
        self.split_bytes = split_bytes if split_bytes and self.own_cores else MAX_MESSAGE_BYTES + 1
        #: a larger message goes by rendezvous where the peer allows it (never streamed when
        #: the ranks outnumber the cores: two copies then cost more than one)
        self.stream_max = stream_max if self.own_cores else EAGER_BYTES

    # ------------------------------------------------------------------ progress
    def progress(self) -> None:
        """Drain every inbox ring into the matcher; push queued sends. Never blocks."""
        if self._closed:
            return
        if self._rlock.acquire(False):
            try:
                for link in self._in_list:
                    if link.reader.has_record() and (self._drain(link) or link.reader.writer_waits()):
                        self.out[link.rank].bell.ring()  # acknowledgements, ring space
            finally:
                self._rlock.release()
        for out in self._out_list:
            if out.queue:
                self._flush(out)

    def drain_from(self, rank: int) -> None:
        """Take in everything ``rank`` wrote (it said goodbye; its last messages still count)."""
        link = self.inbound.get(rank)
        if link is None or not self._rlock.acquire(timeout=self.timeout):
            return
        try:
            if not self._closed and link.reader.has_record():
                self._drain(link)
        finally:
            self._rlock.release()

    def _flush(self, out: OutLink) -> None:
        if not out.lock.acquire(False):
            return
        try:
            moved = False
            while not self._closed and out.queue and out.queue[0].advance():
                out.queue.popleft()
                moved = True
            if not out.queue:
                out.writer.waiting(False)
            if moved or (out.queue and out.queue[0].offset):
                out.bell.ring()
        finally:
            out.lock.release()

    def _drain(self, link: InLink) -> bool:
        """Take every record of ``link`` in; True when its sender may wait on what this did
        (an acknowledgement, the space of a large message's chunks)."""
        try:
            return self._drain_records(link)
        except RingCorrupt as exc:
            self._broken(link, exc)
            return True

    def _broken(self, link: InLink, exc: RingCorrupt) -> PeerError:
        err = PeerError(
            f"rank {link.global_rank} broke the shared-memory protocol ({exc}); closing the channel",
            rank=link.global_rank,
        )
        link.stream = None
        self._corrupt(link.rank, err)
        return err

    def _drain_records(self, link: InLink) -> bool:
        r = link.reader
        data = r.data
        src, gsrc = link.rank, link.global_rank
        large = False
        while r.has_record():
            kind, dtype_char, tag, nbytes, fp, at, n = r.next()
            if kind == K_EAGER:
                if n != nbytes:
                    raise RingCorrupt(f"a message of {nbytes} bytes in a record of {n}")
                landing = self._match(src, tag, nbytes, dtype_char, fp)
                try:
                    view = landing.admit(nbytes, dtype_char, gsrc)
                except Exception as exc:  # noqa: BLE001 - the receiver gets it
                    r.consume(at, n)
                    landing.finish(src, exc)
                    continue
                if n:
                    view[:] = data[at : at + n]
                r.consume(at, n)
                landing.finish(src)
            elif kind == K_RTS:
                large = True
                if n != RTS.size or nbytes > MAX_MESSAGE_BYTES:
                    raise RingCorrupt(f"a rendezvous record of {n} bytes for {nbytes} bytes")
                addr, rts_id = RTS.unpack_from(data, at)
                r.consume(at, n)
                r.ack(rts_id % ACK_SLOTS, (rts_id + 1) << 2 | self._rendezvous(link, tag, nbytes, dtype_char, fp, addr))
            elif kind == K_FIRST:
                large = True
                if link.stream is not None or nbytes > MAX_MESSAGE_BYTES or not 0 < n <= nbytes:
                    raise RingCorrupt(f"a first chunk of {n} bytes for {nbytes} bytes")
                landing = self._match(src, tag, nbytes, dtype_char, fp)
                into: memoryview | None
                try:
                    into = landing.admit(nbytes, dtype_char, gsrc)
                except Exception as exc:  # noqa: BLE001 - the receiver gets it; the chunks are dropped
                    landing.finish(src, exc)
                    into = None
                if into is not None:
                    into[:n] = data[at : at + n]
                r.consume(at, n)
                if n == nbytes:
                    if into is not None:
                        landing.finish(src)
                else:
                    link.stream = [landing, into, n, nbytes]
            else:  # K_MORE
                large = True
                st = link.stream
                if st is None or tag != st[2] or not 0 < n <= st[3] - st[2]:
                    raise RingCorrupt(f"a chunk of {n} bytes at offset {tag} out of sequence")
                landing, view, lo, total = st
                if view is not None:
                    view[lo : lo + n] = data[at : at + n]
                r.consume(at, n)
                st[2] = lo + n
                if lo + n == total:
                    link.stream = None
                    if view is not None:
                        landing.finish(src)
        return large

    def _rendezvous(self, link: InLink, tag: int, nbytes: int, dtype_char: bytes, fp: bytes, addr: int) -> int:
        """Copy a rendezvous message out of the sender's memory into where it lands."""
        src = link.rank
        landing = self._match(src, tag, nbytes, dtype_char, fp)
        try:
            view = landing.admit(nbytes, dtype_char, link.global_rank)
        except Exception as exc:  # noqa: BLE001 - the receiver gets it
            landing.finish(src, exc)
            return ACK_REFUSED
        try:
            self._read_from(link.pid, addr, view)
        except OSError as exc:
            landing.finish(
                src,
                PeerError(
                    f"could not copy a message of {nbytes} bytes out of rank "
                    f"{link.global_rank}'s memory ({exc}); the process may have died",
                    rank=link.global_rank,
                ),
            )
            return ACK_REFUSED
        landing.finish(src)
        return ACK_OK

    def _read_from(self, pid: int, addr: int, view: memoryview) -> None:
        """One rendezvous copy; from ``split_bytes`` on (each rank with a core) in two halves
        at once, the second on the helper thread. Returns once both halves are in (or the
        channel's timeout passed: then an error, and the late half writes only the
        message's own bytes)."""
        n = view.nbytes
        if n < self.split_bytes:
            _cma.read_from(pid, addr, view)
            return
        if self._copier is None:
            self._copier = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="procgroup-tcp-copy")
        half = (n // 2) & ~4095  # a whole number of pages in the first half
        try:
            other = self._copier.submit(_cma.read_from, pid, addr + half, view[half:])
        except RuntimeError:  # the pool was shut down (close, interpreter exit): one piece
            _cma.read_from(pid, addr, view)
            return
        try:
            _cma.read_from(pid, addr, view[:half])
        finally:
            # the helper writes into the caller's buffer: never return before it is done
            try:
                other.result(timeout=self.timeout)
            except concurrent.futures.TimeoutError:
                raise OSError(errno.ETIMEDOUT, f"a half of the copy took more than {self.timeout} s") from None

    def recv_direct(self, src: int, array: np.ndarray, tag: int) -> int:
        """A blocking receive into ``array`` (a C-contiguous NumPy array) from same-host peer
        ``src`` that nothing posted or queued before it could claim (the channel checked
        that, and that ``tag`` is not a collective's): when ``src``'s next record is this
        small message, it is copied from the ring straight into ``array``, with no posting
        and no matching. It waits at most the spin time for the record; -1 when it took
        nothing (another record comes first, another thread is draining, the spin ran out):
        the caller then posts the receive and waits the general way, which drains every
        ring and sees failures. A size or dtype mismatch consumes the record and raises, as
        a posted receive would."""
        link = self.inbound.get(src)
        if link is None or not self._rlock.acquire(False):
            return -1
        try:
            if self._closed:
                return -1
            r = link.reader
            n = array.nbytes
            if n <= SMALL_BYTES:
                # the common case in one call: header checked, payload packed into the array
                dtype = array.dtype
                code = DTYPE_CODES.get(dtype) or dtype_code(dtype)
                try:
                    got = r.take_small(tag, code, array, n, self._spin)  # waits for the record
                except (TypeError, ValueError, BufferError):  # not a writable contiguous buffer
                    got = 0
                if got:
                    if got == 2:  # the sender waits for the space this freed
                        self.out[src].bell.ring()
                    return src
            elif not r.spin(self._spin):
                return -1
            if not r.has_record():
                return -1
            view = byte_view(array)
            try:
                kind, dtype_char, rtag, nbytes, _, at, n = r.next()
                if kind != K_EAGER or rtag != tag:
                    return -1
                if n != nbytes:
                    raise RingCorrupt(f"a message of {nbytes} bytes in a record of {n}")
            except RingCorrupt as exc:
                raise self._broken(link, exc) from None
            try:
                check_size(nbytes, dtype_char, view, array.dtype, link.global_rank)
                if n:
                    view[:] = r.data[at : at + n]
            finally:
                r.consume(at, n)
                if r.writer_waits():
                    self.out[src].bell.ring()
            return src
        finally:
            self._rlock.release()

    # ------------------------------------------------------------------ sending
    def send_small(self, link: OutLink, payload: bytes, tag: int, dtype_char: bytes, fp: bytes) -> bool:
        """A blocking send of at most ``SMALL_BYTES`` given as bytes (a copy of the caller's
        array, so it is done once written): True once written, False when it must go the
        general way (sends queued before it, no ring space, the channel closed)."""
        lock = link.lock
        lock.acquire()  # cheaper than ``with`` on this path
        try:
            if self._closed or link.queue or not link.writer.put_small(dtype_char, tag, fp, payload):
                return False
        finally:
            lock.release()
        # Doorbell.wake inline: after the release, the record's store is fenced before the flag is read
        try:
            if link.bell.words[SLEEPERS_WORD]:
                link.bell.ring()
        except ValueError:  # close() released the bell after the write: nobody is left to wake
            pass
        return True

    def send(self, link: OutLink, view: memoryview, tag: int, dtype_char: bytes, fp: bytes) -> None:
        """A blocking send: returns once ``view`` may be reused."""
        if view.nbytes <= EAGER_BYTES and not link.queue:  # the common case, _start's first branch inline
            with link.lock:
                done = not self._closed and not link.queue and link.writer.put(K_EAGER, dtype_char, tag, fp, view)
            if done:
                link.bell.wake()  # after the release, as send_small
                return
        job = self._start(link, view, tag, dtype_char, fp)
        if job is not None:
            job.wait()

    def isend(self, link: OutLink, view: memoryview, tag: int, dtype_char: bytes, fp: bytes) -> Work:
        job = self._start(link, view, tag, dtype_char, fp)
        return CompletedWork("isend") if job is None else job

    def _start(self, link: OutLink, view: memoryview, tag: int, dtype_char: bytes, fp: bytes) -> SendJob | None:
        """Write the message now when it fits (None: done); else a SendJob to wait on."""
        n = view.nbytes
        with link.lock:
            if self._closed:
                raise ChannelClosedError("the tcp channel is closed (destroy_process_group was called)")
            if not link.queue and n <= EAGER_BYTES and link.writer.put(K_EAGER, dtype_char, tag, fp, view):
                link.bell.ring()
                return None
            job = SendJob(self, link, view, tag, dtype_char, fp)
            if link.queue or not job.advance():
                link.queue.append(job)
            link.bell.ring()
        return job

    def wait_send(self, job: SendJob, timeout: float | None) -> None:
        link = job.link
        limit = self.timeout if timeout is None else timeout

        def check() -> None:
            self._check()
            if not job.finished():
                exc = self._left(link.rank)
                if exc is not None:
                    job.fail(exc)

        def timed_out() -> BaseException:
            return CommTimeoutError(
                f"send to rank {link.global_rank} timed out after {limit}s (it is not receiving)",
                op="send",
                ranks=[link.global_rank],
            )

        n = job.view.nbytes
        # a split rendezvous copy wants both cores: sleep until the receiver acknowledges
        spin = self._spin if job.rts and n >= self.split_bytes else self.spin_for(n)
        if not self.wait_until(job.finished, limit, check, spin):
            raise timed_out()

    def spin_for(self, nbytes: int) -> float:
        """How long a wait for a message of ``nbytes`` spins before it sleeps."""
        if nbytes <= EAGER_BYTES or not self.own_cores:
            return self._spin
        return max(self._spin, min(MAX_SPIN_S, nbytes * SPIN_S_PER_BYTE))

    def wait_until(
        self,
        ready: Callable[[], bool],
        timeout: float,
        check: Callable[[], None] | None = None,
        spin: float | None = None,
    ) -> bool:
        """Drive progress until ``ready()``; False when ``timeout`` passes first. Spins for
        ``spin`` seconds (default: the channel's small-message spin), then sleeps on this
        rank's doorbell (a peer's write wakes it), ``check()`` between naps."""
        progress = self.progress

        def test() -> bool:
            progress()
            return ready()

        if test():
            return True
        now = time.perf_counter()
        deadline, spin_end = now + timeout, now + (self._spin if spin is None else spin)
        slow_at = now + _SLOW_S  # then the flight recorder names the op's caller, once
        while True:
            if test():
                return True
            now = time.perf_counter()
            if now < spin_end:
                continue
            if now >= slow_at:
                slow_at = deadline + 1.0
                _recorder_waiting()
            if check is not None:
                check()
            if now >= deadline:
                return test()
            self.bell.sleep(test, min(NAP_S, deadline - now))

    # ------------------------------------------------------------------ failure and teardown
    def fail_all(self, exc: BaseException) -> None:
        """The channel broke or closes: fail every send in flight and every half-streamed receive."""
        for link in self._in_list:
            st = link.stream
            link.stream = None
            if st is not None and st[1] is not None:
                st[0].fail(exc)
        for out in self._out_list:
            for job in list(out.queue) + list(out.rts_pending.values()):
                if job.rts and job.written and not job.finished():
                    _ORPHANS.append(job.view)  # the receiver may still read it
                job.fail(exc)

    def fail_to(self, rank: int, exc: BaseException) -> int:
        """``rank`` said goodbye: sends still queued for it will never be taken, nor will a
        message it was streaming arrive whole; how many ops that failed."""
        failed = 0
        out = self.out.get(rank)
        if out is not None:
            for job in list(out.queue) + list(out.rts_pending.values()):
                job.fail(exc)
                failed += 1
        link = self.inbound.get(rank)
        if link is not None and link.stream is not None:
            st, link.stream = link.stream, None
            if st[1] is not None:
                st[0].fail(exc)
                failed += 1
        return failed

    def close(self) -> None:
        self.fail_all(ChannelClosedError("the tcp channel was closed while this send was pending"))
        held = self._rlock.acquire(timeout=1.0)  # a drain in progress on another thread ends first
        try:
            self._closed = True
            for out in self._out_list:
                with out.lock:
                    out.queue.clear()
                    out.rts_pending.clear()
            for link in self._in_list:
                link.reader.release()
            for out in self._out_list:
                out.writer.release()
                out.bell.release()
            self.bell.release()
            if self._copier is not None:
                self._copier.shutdown(wait=False)  # idle: a copy ends before its receive does
            for view in self._views:
                view.release()
            for mm in self._maps:
                try:
                    mm.close()
                except BufferError:
                    pass  # a view is still held elsewhere; the OS frees it at exit
        finally:
            if held:
                self._rlock.release()


# ---------------------------------------------------------------------------- set-up
def _local_candidates(ctx: Any, wanted: bool) -> list[int]:
    """Collective: the ranks on this host that allow shared-memory p2p (when this one does)."""
    me = f"{host_identity()}|{int(wanted)}"
    ctx.store.set(f"tcp/p2p/host/{ctx.rank}", me)
    if not wanted:
        return []
    return [
        r
        for r in range(ctx.size)
        if r != ctx.rank and ctx.store.get(f"tcp/p2p/host/{r}", timeout=ctx.timeout).decode() == me
    ]


def _create_inbox(nbytes: int) -> tuple[str, mmap.mmap]:
    name = f"procgroup-p2p-{os.getpid()}-{os.urandom(16).hex()}"
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)  # a full /dev/shm fails here, not with SIGBUS later
        return name, mmap.mmap(fd, nbytes)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def _map_inbox(name: str, nbytes: int) -> mmap.mmap:
    """Map a peer's inbox after checking it is what it claims to be (ours, 0600, that size)."""
    if not _NAME.fullmatch(name):
        raise OSError(f"not a procgroup inbox name: {name!r}")
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600 or st.st_size != nbytes:
            raise OSError(f"/dev/shm/{name} is not a 0600 file of this user of {nbytes} bytes")
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def _exchange(
    peers: dict[int, Peer], matcher: Matcher, sockets: Progress, msgs: dict[int, bytes], size: int, timeout: float
) -> dict[int, bytes]:
    """Send each peer its message over the authenticated socket; receive one of ``size`` bytes
    from each, waiting on the ``sockets`` strategy (the matcher has none yet: set-up)."""
    bufs = {r: np.empty(size, dtype=np.uint8) for r in msgs}
    works = {r: matcher.post(memoryview(bufs[r]), r, SETUP_TAG, bufs[r].dtype) for r in msgs}
    for r, body in msgs.items():
        peers[r].send(memoryview(body), SETUP_TAG, b"B", NO_FP)
    for work in works.values():
        if isinstance(work, PostedRecv) and not work.completed and not sockets.wait(work, timeout):
            work.timed_out(timeout, False)  # withdrawn, CommTimeoutError
        work.wait(timeout)  # raises the error it landed with, if any
    return {r: bufs[r].tobytes() for r in msgs}


def open_p2p(
    ctx: Any,
    peers: dict[int, Peer],
    matcher: Matcher,
    sockets: Progress,
    check: Callable[[], None],
    left: Callable[[int], BaseException | None],
    match: Callable[[int, int, int, bytes, bytes], Landing],
    corrupt: Callable[[int, BaseException], None],
) -> ShmP2P | None:
    """Collective: the shared-memory links of this channel, or None when no pair can have one."""
    candidates = _local_candidates(ctx, p2p_wanted(ctx.options))
    if not candidates:
        return None
    # bad settings fail here, before any inbox exists
    cores = usable_cores(ctx.options)
    split = env_bytes(ENV_SHM_SPLIT, SPLIT_READ_BYTES, name="shm_split_bytes", options=ctx.options,
                      hint="0: never split a copy")
    stream_max = env_bytes(ENV_SHM_STREAM_MAX, STREAM_MAX_BYTES, name="shm_stream_max_bytes", options=ctx.options,
                           hint="0: never stream where the rendezvous copy may be made")
    slot = {r: i for i, r in enumerate(candidates)}
    inbox_bytes = BLOCK_BYTES + len(candidates) * ring_bytes(RING_BYTES)
    name, inbox, maps = "", None, []
    try:
        try:
            name, inbox = _create_inbox(inbox_bytes)
        except OSError as exc:
            log.warning("procgroup tcp: no shared-memory inbox (%s); point-to-point stays on the sockets", exc)
        probe = _cma.Probe()
        cma_wanted = _cma.available() and env_flag(ENV_SHM_CMA, True, name="shm_cma", options=ctx.options)
        hellos = {
            r: _HELLO.pack(
                _MAGIC,
                _VERSION,
                os.getpid(),
                inbox_bytes if name else 0,
                BLOCK_BYTES + slot[r] * ring_bytes(RING_BYTES),
                probe.address,
                probe.data,
                name.encode(),
            )
            for r in candidates
        }
        theirs = _exchange(peers, matcher, sockets, hellos, _HELLO.size, ctx.timeout)
        mapped: dict[int, tuple[mmap.mmap, int]] = {}
        pids: dict[int, int] = {}
        can_read: dict[int, bool] = {}
        for r, body in theirs.items():
            magic, version, pid, their_bytes, my_offset, paddr, pdata, raw = _HELLO.unpack(body)
            if magic != _MAGIC or version != _VERSION:
                log.warning("procgroup tcp: rank %d sent a bad shared-memory hello", ctx.global_rank(r))
                continue
            pids[r] = pid
            can_read[r] = cma_wanted and _cma.check_probe(pid, paddr, pdata)
            their_name = raw.rstrip(b"\0").decode("ascii", "replace")
            if not their_bytes or not BLOCK_BYTES <= my_offset <= their_bytes - ring_bytes(RING_BYTES):
                continue
            try:
                mm = _map_inbox(their_name, their_bytes)
            except OSError as exc:
                log.warning("procgroup tcp: cannot map rank %d's inbox: %s", ctx.global_rank(r), exc)
                continue
            maps.append(mm)
            mapped[r] = (mm, my_offset)
        replies = {r: _MAPPED.pack(_MAGIC, int(r in mapped), int(can_read.get(r, False))) for r in candidates}
        answers = _exchange(peers, matcher, sockets, replies, _MAPPED.size, ctx.timeout)
    finally:
        if name:
            os.unlink(f"/dev/shm/{name}")  # every peer has mapped it, or never will
    out: dict[int, OutLink] = {}
    inbound: dict[int, InLink] = {}
    views: list[memoryview] = []
    inbox_view = memoryview(inbox) if inbox is not None else None
    for r, body in answers.items():
        magic, they_mapped, they_read = _MAPPED.unpack(body)
        if magic != _MAGIC or not they_mapped or r not in mapped or inbox is None:
            continue  # a pair uses shared memory only when both ends mapped each other's inbox
        mm, offset = mapped[r]
        views.append(memoryview(mm))
        out[r] = OutLink(
            r, ctx.global_rank(r), RingWriter(views[-1], offset, RING_BYTES), Doorbell(views[-1]), bool(they_read)
        )
        inbound[r] = InLink(
            r,
            ctx.global_rank(r),
            RingReader(
                inbox_view,  # type: ignore[arg-type]  # not None: the loop skips a rank when inbox is None
                BLOCK_BYTES + slot[r] * ring_bytes(RING_BYTES),
                RING_BYTES,
            ),
            pids[r],
        )
    if inbox_view is not None:
        views.append(inbox_view)
        maps.append(inbox)  # type: ignore[arg-type]  # inbox_view exists only with an inbox
    if not out:
        for view in views:
            view.release()
        for mm in maps:
            mm.close()
        return None
    log.debug(
        "procgroup tcp: shared-memory p2p with ranks %s (rendezvous copy: %s)",
        [ctx.global_rank(r) for r in out],
        [ctx.global_rank(r) for r, o in out.items() if o.cma],
    )
    bell = Doorbell(inbox_view)  # type: ignore[arg-type]  # out is not empty, so an inbox was mapped
    return ShmP2P(maps, views, bell, out, inbound, ctx.timeout, check, left, match, corrupt, cores,
                  split or 0, stream_max or 0)


__all__ = [
    "CHUNK_BYTES",
    "EAGER_BYTES",
    "ENV_SHM_CMA",
    "ENV_SHM_CORES",
    "ENV_SHM_P2P",
    "ENV_SHM_SPLIT",
    "ENV_SHM_STREAM_MAX",
    "MAX_SPIN_S",
    "RING_BYTES",
    "SETUP_TAG",
    "SPIN_S_PER_BYTE",
    "SPLIT_READ_BYTES",
    "STREAM_MAX_BYTES",
    "ShmP2P",
    "open_p2p",
    "p2p_wanted",
    "usable_cores",
]
