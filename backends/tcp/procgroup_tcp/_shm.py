"""Shared-memory all_reduce for the tcp backend when every rank runs on one host.

One file in /dev/shm, mapped by every rank and unlinked as soon as all have mapped it
(nothing is left behind if a rank dies). Layout: a flag line per rank (64 bytes, so
ranks never share a cache line), two small slots per rank (double-buffered, for
messages up to ``SMALL_BYTES``), and one large slot per rank for big arrays, which are
processed in pieces of the slot's size.

Synchronisation is by monotonic counters in the flag lines: a rank writes its data,
then bumps its counter; the others spin, then yield, then sleep briefly until every
counter has reached the target. x86-64 keeps stores in program order (TSO), which is
what makes "data, then counter" safe; other architectures use the socket path. While
waiting, a peer's death (seen by the tcp reader threads) or the channel timeout ends
the wait with the same errors as the socket path.
"""

from __future__ import annotations

import logging
import mmap
import os
import platform
import socket
import time
import uuid
from typing import TYPE_CHECKING

import numpy as np

from procgroup.algorithms.ring import chunk_bounds
from procgroup.config import ENV_SHM
from procgroup.errors import CommTimeoutError
from procgroup.ops import ReduceOp, finish_average, reduce_into

if TYPE_CHECKING:
    from .channel import TcpChannel

log = logging.getLogger(__name__)

SMALL_BYTES = 64 * 1024
LARGE_SLOT_BYTES = 16 * 1024 * 1024
_FLAG_STRIDE = 8  # uint64 per rank: [seq, barrier, ...] on its own 64-byte line
_SEQ, _BARRIER = 0, 1


def host_identity() -> str:
    """Same string on every process of one machine (and one kernel boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shm_wanted() -> bool:
    """This process allows the shared-memory path (on by default where it is safe)."""
    setting = os.environ.get(ENV_SHM, "1").strip().lower()
    return setting not in ("0", "false", "no", "off") and platform.machine() in ("x86_64", "AMD64")


class SharedMemoryArena:
    """The mapped region and the all_reduce algorithms that run on it."""

    def __init__(self, channel: "TcpChannel", mm: mmap.mmap) -> None:
        self.channel = channel
        n = channel.size
        self.rank = channel.rank
        self.size = n
        self._mm = mm
        flags_bytes = n * _FLAG_STRIDE * 8
        small_bytes = 2 * n * SMALL_BYTES
        self.flags = np.frombuffer(mm, dtype=np.uint64, count=n * _FLAG_STRIDE).reshape(n, _FLAG_STRIDE)
        self.small = np.frombuffer(mm, dtype=np.uint8, count=small_bytes, offset=flags_bytes).reshape(2, n, SMALL_BYTES)
        self.large = np.frombuffer(mm, dtype=np.uint8, count=n * LARGE_SLOT_BYTES,
                                   offset=flags_bytes + small_bytes).reshape(n, LARGE_SLOT_BYTES)
        self._seq = 0
        self._barrier = 0
        self._oversubscribed = n > (os.cpu_count() or 1)

    @staticmethod
    def region_bytes(n: int) -> int:
        return n * _FLAG_STRIDE * 8 + 2 * n * SMALL_BYTES + n * LARGE_SLOT_BYTES

    @classmethod
    def open(cls, channel: "TcpChannel") -> "SharedMemoryArena":
        """Collective: rank 0 creates the file, everyone maps it, then it is unlinked."""
        ctx = channel.ctx
        nbytes = cls.region_bytes(channel.size)
        if channel.rank == 0:
            path = f"/dev/shm/procgroup-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(fd, nbytes)
            ctx.store.set("tcp/shm/path", path)
        else:
            path = ctx.store.get("tcp/shm/path", timeout=ctx.timeout).decode()
            fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, nbytes)
        finally:
            os.close(fd)
        channel.barrier()  # over the sockets: everyone has mapped it
        if channel.rank == 0:
            os.unlink(path)
        return cls(channel, mm)

    def close(self) -> None:
        # numpy views keep the buffer exported; dropping them lets the map close
        del self.flags, self.small, self.large
        try:
            self._mm.close()
        except BufferError:
            pass  # an async op still holds a view; the OS frees it at exit

    # ------------------------------------------------------------------ waiting
    def _wait_all(self, column: int, target: int, what: str) -> None:
        col = self.flags[:, column]
        if (col >= target).all():
            return
        deadline = time.monotonic() + self.channel.timeout
        spins = 0
        while not (col >= target).all():
            spins += 1
            if spins > 200 or self._oversubscribed:
                if spins < 2000:
                    os.sched_yield()
                else:
                    time.sleep(0.00005)
                if spins % 256 == 0:
                    self.channel._raise_if_unusable()
                    if time.monotonic() > deadline:
                        late = [self.channel.ctx.global_rank(k) for k in range(self.size) if col[k] < target]
                        who = f"rank {late[0]}" if len(late) == 1 else f"ranks {late}"
                        raise CommTimeoutError(
                            f"timed out after {self.channel.timeout}s waiting for {who}", op=what, ranks=late)

    def _barrier_all(self) -> None:
        self._barrier += 1
        self.flags[self.rank, _BARRIER] = self._barrier
        self._wait_all(_BARRIER, self._barrier, "all_reduce")

    # ------------------------------------------------------------------ algorithms
    def all_reduce(self, array: np.ndarray, op: ReduceOp) -> None:
        if array.nbytes <= SMALL_BYTES:
            self._small_all_reduce(array, op)
        else:
            self._large_all_reduce(array, op)

    def _small_round(self, payload: np.ndarray | None) -> np.ndarray:
        """One exchange through the small slots: write ``payload`` (if any), wait for all.

        Returns the slots (n x SMALL_BYTES) to read from. Double-buffered by parity: the
        buffer used now was last read two rounds ago, so waiting until every rank has
        reached the previous round makes it free.
        """
        self._seq += 1
        seq = self._seq
        self._wait_all(_SEQ, seq - 1, "collective")
        slots = self.small[seq % 2]
        if payload is not None:
            slots[self.rank, : payload.nbytes] = payload.reshape(-1).view(np.uint8)
        self.flags[self.rank, _SEQ] = seq
        self._wait_all(_SEQ, seq, "collective")
        return slots

    def _small_all_reduce(self, array: np.ndarray, op: ReduceOp) -> None:
        """Everyone publishes, everyone reduces all slots in rank order: one round trip."""
        flat = array.reshape(-1)
        slots = self._small_round(flat)
        views = [slots[k, : flat.nbytes].view(flat.dtype) for k in range(self.size)]
        flat[...] = views[0]
        for k in range(1, self.size):
            reduce_into(op, flat, views[k])
        finish_average(op, flat, self.size)

    def _pieces(self, count: int, itemsize: int, parts: int = 1) -> list[tuple[int, int]]:
        """Element ranges that fit a large slot ``parts`` times over."""
        step = max(LARGE_SLOT_BYTES // (itemsize * parts), 1)
        return [(s, min(s + step, count)) for s in range(0, count, step)]

    def _slot(self, rank: int, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        return self.large[rank, offset * dtype.itemsize : (offset + count) * dtype.itemsize].view(dtype)

    def broadcast(self, array: np.ndarray, root: int) -> None:
        """The root publishes, the others copy; in pieces of one slot."""
        flat = array.reshape(-1)
        if flat.nbytes <= SMALL_BYTES:
            slots = self._small_round(flat if self.rank == root else None)
            if self.rank != root:
                flat.view(np.uint8)[...] = slots[root, : flat.nbytes]
            return
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            self._barrier_all()
            if self.rank == root:
                self._slot(root, flat.dtype, hi - lo)[...] = flat[lo:hi]
            self._barrier_all()
            if self.rank != root:
                flat[lo:hi] = self._slot(root, flat.dtype, hi - lo)

    def all_gather(self, outputs: list[np.ndarray], array: np.ndarray) -> None:
        """Everyone publishes its array, everyone copies every slot into its outputs."""
        flat = array.reshape(-1)
        outs = [o.reshape(-1) for o in outputs]
        if flat.nbytes <= SMALL_BYTES:
            slots = self._small_round(flat)
            for k in range(self.size):
                outs[k].view(np.uint8)[...] = slots[k, : flat.nbytes]
            return
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            self._barrier_all()
            self._slot(self.rank, flat.dtype, hi - lo)[...] = flat[lo:hi]
            self._barrier_all()
            for k in range(self.size):
                outs[k][lo:hi] = self._slot(k, flat.dtype, hi - lo)

    def reduce(self, array: np.ndarray, root: int, op: ReduceOp) -> None:
        """Everyone publishes; each reduces its chunk in its own slot; the root collects.

        Non-root arrays are only read, never written.
        """
        flat = array.reshape(-1)
        if flat.nbytes <= SMALL_BYTES:
            slots = self._small_round(flat)
            if self.rank == root:
                views = [slots[k, : flat.nbytes].view(flat.dtype) for k in range(self.size)]
                flat[...] = views[0]
                for k in range(1, self.size):
                    reduce_into(op, flat, views[k])
                finish_average(op, flat, self.size)
            return
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            count = hi - lo
            bounds = chunk_bounds(count, self.size)
            slots = [self._slot(k, flat.dtype, count) for k in range(self.size)]
            self._barrier_all()
            slots[self.rank][...] = flat[lo:hi]
            self._barrier_all()
            c0, c1 = bounds[self.rank], bounds[self.rank + 1]
            for k in range(self.size):
                if k != self.rank:
                    reduce_into(op, slots[self.rank][c0:c1], slots[k][c0:c1])
            finish_average(op, slots[self.rank][c0:c1], self.size)
            self._barrier_all()
            if self.rank == root:
                for k in range(self.size):
                    flat[lo + bounds[k] : lo + bounds[k + 1]] = slots[k][bounds[k] : bounds[k + 1]]

    def reduce_scatter(self, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None:
        """Each rank publishes what the others reduce; rank r reduces every input[r]."""
        out = output.reshape(-1)
        ins = [i.reshape(-1) for i in inputs]
        n, r = self.size, self.rank
        for lo, hi in self._pieces(out.size, out.itemsize, parts=n):
            count = hi - lo
            self._barrier_all()
            for j in range(n):
                if j != r:
                    self._slot(r, out.dtype, count, offset=j * count)[...] = ins[j][lo:hi]
            self._barrier_all()
            acc = out[lo:hi]
            acc[...] = ins[r][lo:hi]
            for k in range(n):
                if k != r:
                    reduce_into(op, acc, self._slot(k, out.dtype, count, offset=r * count))
            finish_average(op, acc, n)

    def _large_all_reduce(self, array: np.ndarray, op: ReduceOp) -> None:
        """Per piece: publish the chunks others reduce, reduce mine, publish it, copy the rest."""
        flat = array.reshape(-1)
        itemsize = flat.itemsize
        piece = LARGE_SLOT_BYTES // itemsize
        mine = self.large[self.rank]
        for start in range(0, flat.size, piece):
            part = flat[start : start + piece]
            count = part.size
            bounds = chunk_bounds(count, self.size)
            slots = [self.large[k, : count * itemsize].view(flat.dtype) for k in range(self.size)]
            lo, hi = bounds[self.rank], bounds[self.rank + 1]
            self._barrier_all()  # nobody still reads what the slots held before
            # the others need only the chunks they reduce, not mine
            mine[: lo * itemsize] = part[:lo].view(np.uint8)
            mine[hi * itemsize : count * itemsize] = part[hi:].view(np.uint8)
            self._barrier_all()
            acc = part[lo:hi]
            for k in range(self.size):
                if k != self.rank:
                    reduce_into(op, acc, slots[k][lo:hi])
            finish_average(op, acc, self.size)
            slots[self.rank][lo:hi] = acc
            self._barrier_all()
            for k in range(self.size):
                if k != self.rank:
                    part[bounds[k] : bounds[k + 1]] = slots[k][bounds[k] : bounds[k + 1]]
