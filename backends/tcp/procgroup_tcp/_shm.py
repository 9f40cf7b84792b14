"""Shared-memory collectives for the tcp backend when every rank runs on one host.

One file in /dev/shm, mapped by every rank and unlinked as soon as all have mapped it
(nothing is left behind if a rank dies). Layout: a flag line per rank (64 bytes, so
ranks never share a cache line), two small slots per rank (double-buffered, for
messages up to ``SMALL_BYTES``), and one large slot per rank for big arrays, which are
processed in pieces of the slot's size.

Synchronisation is by monotonic counters in the flag lines: a rank writes its data,
then bumps its counter; the others wait (:func:`procgroup.backend.poll`) until every
counter has reached the target. Every op starts with a round through the small slots
in which each rank publishes what it is about to do (op, size, dtype, root, reduce
op) beside its counter; all compare, so ranks that disagree all raise the same
MismatchError at the same step and the counters stay in agreement (the group stays
usable). x86-64 keeps stores in program order (TSO), which is
what makes "data, then counter" safe; other architectures use the socket path. While
waiting, a peer's death (seen by the tcp reader threads, asked through ``check`` and
``left``) or the channel timeout ends the wait with the socket path's errors.
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
import platform
import socket
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
from procgroup.algorithms.ring import chunk_bounds
from procgroup.backend import ChannelContext, Fingerprint, env_flag, mismatch, poll
from procgroup.errors import ChannelClosedError, CommTimeoutError, MismatchError, PeerError
from procgroup.ops import ReduceOp, finish_average, reduce_into


log = logging.getLogger(__name__)

#: PROCGROUP_TCP_SHM=0 turns the arena off (channel option ``shm`` overrides it).
ENV_SHM = "PROCGROUP_TCP_SHM"

SMALL_BYTES = 64 * 1024
LARGE_SLOT_BYTES = 16 * 1024 * 1024
#: uint64 words per rank, one 64-byte line each: counters, then what the rank is doing
_FLAG_STRIDE = 8
_SEQ, _BARRIER = 0, 1
_SMALL_SIG = (2, 4)  # (size, op) words of the small round, one pair per buffer parity
#: a ReduceOp's number in the op descriptions the ranks compare (0: none)
_OP_CODES = {op: i + 1 for i, op in enumerate(ReduceOp)}
_REDUCE_OPS = {i + 1: op for i, op in enumerate(ReduceOp)}
#: tests of a wait made inline before it goes to poll() (a few microseconds)
_INLINE_TESTS = 64
_OPCODES = {"all_reduce": 1, "broadcast": 2, "reduce": 3, "all_gather": 4, "reduce_scatter": 5, "all_to_all": 6,
            "gather": 7, "scatter": 8, "barrier": 9}
_OPNAMES = {code: name for name, code in _OPCODES.items()}
_BYTE = np.dtype(np.uint8)
NO_ROOT = -1

F = TypeVar("F", bound=Callable[..., Any])


def host_identity() -> str:
    """Same string on every process of one machine (and one kernel boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shm_possible(options: Mapping[str, Any] | None = None) -> bool:
    """This process allows the shared-memory path and can run it safely.

    On by default on x86-64 Linux (store order is what the counters rely on, and
    /dev/shm is where the arena lives); PROCGROUP_TCP_SHM=0 or the channel option
    ``shm=False`` (a side channel whose collectives never run here) turns it off.
    """
    return (env_flag(ENV_SHM, True, name="shm", options=options) and sys.platform.startswith("linux")
            and platform.machine() in ("x86_64", "AMD64") and os.path.isdir("/dev/shm"))


def all_on_one_host(ctx: ChannelContext) -> bool:
    """Collective: every rank shares this host and can use shared memory."""
    me = f"{host_identity()}|{'shm' if shm_possible(ctx.options) else 'no-shm'}"
    ctx.store.set(f"tcp/host/{ctx.rank}", me)
    ids = {ctx.store.get(f"tcp/host/{r}", timeout=ctx.timeout).decode() for r in range(ctx.size)}
    return len(ids) == 1 and me.endswith("|shm")


def _guarded(op: str) -> Callable[[F], F]:
    """An arena op: check the ranks agree on it; any failure inside breaks the channel.

    After an interrupted op the counters of the ranks disagree, and reusing the slots
    could mix data silently; the socket path stays safe, the arena does not.
    """
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(self: SharedMemoryArena, *args: Any) -> Any:
            self._op = op
            try:
                return fn(self, *args)
            except MismatchError:
                raise  # found by every rank at the same step: the counters still agree
            except BaseException as exc:
                if self._closed:  # the region went away under a pending op (close())
                    raise ChannelClosedError(
                        f"the tcp channel was closed while this {op} was pending") from None
                self._broken(PeerError(
                    f"a shared-memory collective was interrupted ({type(exc).__name__}: {exc}); "
                    f"this group cannot be used any more"))
                raise
        return run  # type: ignore[return-value]  # the same signature as fn
    return wrap


class SharedMemoryArena:
    """The mapped region and the collectives that run on it.

    ``check()`` raises when the channel is closed or broken, ``left(rank)`` is the error
    of a wait on a peer that said goodbye (None while it has not: the channel's, which names
    an earlier failure first), ``broken(exc)`` breaks the channel after an interrupted op.
    """

    def __init__(self, ctx: ChannelContext, mm: mmap.mmap, check: Callable[[], None],
                 left: Callable[[int], BaseException | None], broken: Callable[[BaseException], Any]) -> None:
        self.ctx = ctx
        n = ctx.size
        self.rank = ctx.rank
        self.size = n
        self.timeout = ctx.timeout
        self._check = check
        self._left = left
        self._broken = broken
        self._mm = mm
        flags_bytes = n * _FLAG_STRIDE * 8
        small_bytes = 2 * n * SMALL_BYTES
        # the flag words as Python ints: a few words are read per wait, and a memoryview
        # reads one in a fraction of what a NumPy comparison over the column costs
        self._fl = memoryview(mm)[:flags_bytes].cast("Q")
        self.small = np.frombuffer(mm, dtype=np.uint8, count=small_bytes, offset=flags_bytes).reshape(2, n, SMALL_BYTES)
        self.large = np.frombuffer(mm, dtype=np.uint8, count=n * LARGE_SLOT_BYTES,
                                   offset=flags_bytes + small_bytes).reshape(n, LARGE_SLOT_BYTES)
        self._seq = 0
        self._barrier = 0
        self._op = ""
        # more ranks than cores: spinning only delays the rank we wait for
        oversubscribed = n > (os.cpu_count() or 1)
        self._spins = range(1 if oversubscribed else _INLINE_TESTS)
        self._spin = 0.0 if oversubscribed else 200e-6
        self._small_views: dict[tuple[int, int, np.dtype], list[np.ndarray]] = {}
        self._waiting = (0, 0)  # (column, target) of the wait in progress
        self._test = self._reached_waiting

    @staticmethod
    def region_bytes(n: int) -> int:
        return n * _FLAG_STRIDE * 8 + 2 * n * SMALL_BYTES + n * LARGE_SLOT_BYTES

    @classmethod
    def open(cls, ctx: ChannelContext, check: Callable[[], None], left: Callable[[int], BaseException | None],
             broken: Callable[[BaseException], Any]) -> SharedMemoryArena | None:
        """Collective: rank 0 creates the file, all map it, it is unlinked; None on failure.

        Every rank reports whether it could map the region, so all use the arena or
        all fall back to the sockets (a /dev/shm too small for it, say). The space is
        allocated up front, so a full /dev/shm fails here and not with SIGBUS later.
        """
        nbytes = cls.region_bytes(ctx.size)
        path, mm, problem = "", None, ""
        try:
            if ctx.rank == 0:
                path = f"/dev/shm/procgroup-{os.getpid()}-{uuid.uuid4().hex[:12]}"
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except OSError:
                    os.close(fd)
                    os.unlink(path)
                    path = ""
                    raise
                ctx.store.set("tcp/shm/path", path)
            else:
                path = ctx.store.get("tcp/shm/path", timeout=ctx.timeout).decode()
                if not path:
                    raise OSError("rank 0 could not create the shared-memory region")
                fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
        except OSError as exc:
            problem = str(exc) or type(exc).__name__
            if ctx.rank == 0 and not path:
                ctx.store.set("tcp/shm/path", "")
        try:
            ctx.store.set(f"tcp/shm/ok/{ctx.rank}", problem)
            reports = [ctx.store.get(f"tcp/shm/ok/{r}", timeout=ctx.timeout).decode() for r in range(ctx.size)]
        finally:
            if ctx.rank == 0 and path:
                os.unlink(path)  # everyone has reported: all who could map it have
        failed = {r: why for r, why in enumerate(reports) if why}
        if failed:
            log.warning("procgroup tcp: shared memory unavailable (%s); using sockets",
                        "; ".join(f"rank {ctx.global_rank(r)}: {why}" for r, why in failed.items()))
            if mm is not None:
                mm.close()
            return None
        return cls(ctx, mm, check, left, broken) if mm is not None else None

    _closed = False

    def close(self) -> None:
        self._closed = True  # an op still running on another thread fails as closed
        # numpy views keep the buffer exported; dropping them lets the map close
        self._small_views.clear()
        del self.small, self.large
        self._fl.release()
        try:
            self._mm.close()
        except BufferError:
            pass  # an async op still holds a view; the OS frees it at exit

    # ------------------------------------------------------------------ agreement
    def _publish(self, word: int, nbytes: int, dtype: np.dtype, root: int, reduce_code: int) -> None:
        """What this rank is about to do, for the others to compare with theirs."""
        at = self.rank * _FLAG_STRIDE + word
        self._fl[at] = nbytes
        self._fl[at + 1] = _OPCODES[self._op] | ord(dtype.char) << 8 | reduce_code << 16 | (root + 1) << 24

    def _described(self, at: int) -> Fingerprint:
        """The op a rank published at flag word ``at``, as a Fingerprint (for messages)."""
        nbytes, desc = self._fl[at], self._fl[at + 1]
        return Fingerprint(_OPNAMES.get(desc & 0xFF, f"op#{desc & 0xFF}"), self._seq, chr(desc >> 8 & 0xFF),
                           nbytes, (desc >> 24) - 1, _REDUCE_OPS.get(desc >> 16 & 0xFF))

    def _check_agreement(self, word: int) -> None:
        fl = self._fl
        mine = self.rank * _FLAG_STRIDE + word
        size, kind = fl[mine], fl[mine + 1]
        for k in range(self.size):
            if fl[k * _FLAG_STRIDE + word] != size or fl[k * _FLAG_STRIDE + word + 1] != kind:
                break
        else:
            return
        exc = mismatch(self._described(mine), self._described(k * _FLAG_STRIDE + word),
                       self.ctx.global_rank(self.rank), self.ctx.global_rank(k))
        differ = [self.ctx.global_rank(j) for j in range(self.size)
                  if fl[j * _FLAG_STRIDE + word] != size or fl[j * _FLAG_STRIDE + word + 1] != kind]
        if len(differ) > 1:
            exc = MismatchError(f"{exc} (ranks {differ} differ from rank {self.ctx.global_rank(self.rank)})",
                                ranks=sorted({self.ctx.global_rank(self.rank), *differ}))
        raise exc

    def agree(self, op: str, array: np.ndarray | None, root: int = NO_ROOT) -> None:
        """Collective: the ranks agree on ``op`` (run over the sockets next), or all raise
        MismatchError; for a barrier, this round is the whole op."""
        self._op = op
        try:
            if array is None:
                self._small_round(None, 0, _BYTE, root)
            else:
                self._small_round(None, array.nbytes, array.dtype, root)
        except MismatchError:
            raise
        except BaseException as exc:
            self._broken(PeerError(
                f"a shared-memory collective was interrupted ({type(exc).__name__}: {exc}); "
                f"this group cannot be used any more"))
            raise

    # ------------------------------------------------------------------ waiting
    def _wait_all(self, column: int, target: int) -> None:
        """Return once every rank's counter in ``column`` reaches ``target``.

        Most waits end within a few microseconds, so they are tested inline first
        (entering the poll costs about as much as a short wait); a longer one goes to
        procgroup.backend.poll, whose checks see a peer that died or left, and whose
        deadline is the timeout. The poll's test is bound once, in __init__.
        """
        if self._reached(column, target):
            return
        reached = self._reached
        for _ in self._spins:
            if reached(column, target):
                return
        self._waiting = (column, target)
        poll(self._test, self.timeout, spin=self._spin, check=self._check_peers, on_timeout=self._timed_out)

    def _reached(self, column: int, target: int) -> bool:
        """Every rank's counter in ``column`` is at least ``target``."""
        fl = self._fl
        for at in range(column, self.size * _FLAG_STRIDE, _FLAG_STRIDE):
            if fl[at] < target:
                return False
        return True

    def _reached_waiting(self) -> bool:
        return self._reached(*self._waiting)

    def _late(self) -> list[int]:
        column, target = self._waiting
        return [k for k in range(self.size) if self._fl[k * _FLAG_STRIDE + column] < target]

    def _check_peers(self) -> None:
        self._check()
        for k in self._late():
            exc = self._left(k)
            if exc is not None:
                raise exc

    def _timed_out(self) -> BaseException:
        names = [self.ctx.global_rank(k) for k in self._late()]
        who = f"rank {names[0]}" if len(names) == 1 else f"ranks {names}"
        return CommTimeoutError(f"timed out after {self.timeout}s waiting for {who}", op=self._op, ranks=names)

    def _barrier_all(self) -> None:
        self._barrier += 1
        self._fl[self.rank * _FLAG_STRIDE + _BARRIER] = self._barrier
        self._wait_all(_BARRIER, self._barrier)

    def _small_round(self, payload: np.ndarray | None, nbytes: int, dtype: np.dtype, root: int = NO_ROOT,
                     reduce_code: int = 0) -> np.ndarray:
        """One exchange through the small slots: write ``payload`` (if any), wait for all.

        Returns the slots (n x SMALL_BYTES) to read from. Double-buffered by parity: the
        buffer used now was last read two rounds ago, so waiting until every rank has
        reached the previous round makes it free. The ranks' descriptions of the op ride
        along (one pair of words per parity) and must agree.
        """
        self._seq += 1
        seq = self._seq
        self._wait_all(_SEQ, seq - 1)
        slots = self.small[seq % 2]
        if payload is not None:  # a flat array of ``dtype``, ``nbytes`` long
            self._small_slot_views(nbytes, dtype)[self.rank][...] = payload
        word = _SMALL_SIG[seq % 2]
        self._publish(word, nbytes, dtype, root, reduce_code)
        self._fl[self.rank * _FLAG_STRIDE + _SEQ] = seq
        self._wait_all(_SEQ, seq)
        self._check_agreement(word)
        return slots

    def _small_slot_views(self, nbytes: int, dtype: np.dtype) -> list[np.ndarray]:
        """Every rank's small slot of the current round as ``dtype`` (views, cached)."""
        key = (self._seq % 2, nbytes, dtype)
        views = self._small_views.get(key)
        if views is None:
            if len(self._small_views) >= 256:
                self._small_views.clear()
            slots = self.small[self._seq % 2]
            views = self._small_views[key] = [slots[k, :nbytes].view(dtype) for k in range(self.size)]
        return views

    def _large_begin(self, nbytes: int, dtype: np.dtype, root: int = NO_ROOT, reduce_code: int = 0) -> None:
        """Agree on the op before any slot is touched: a small round with no payload."""
        self._small_round(None, nbytes, dtype, root, reduce_code)

    def _pieces(self, count: int, itemsize: int, parts: int = 1) -> list[tuple[int, int]]:
        """Element ranges that fit a large slot ``parts`` times over."""
        step = max(LARGE_SLOT_BYTES // (itemsize * parts), 1)
        return [(s, min(s + step, count)) for s in range(0, count, step)]

    def _slot(self, rank: int, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        return self.large[rank, offset * dtype.itemsize : (offset + count) * dtype.itemsize].view(dtype)

    def _reduce_slots_into(self, out: np.ndarray, views: list[np.ndarray], op: ReduceOp) -> None:
        """out = op over every rank's view, in rank order (the same bits on every rank)."""
        out[...] = views[0]
        for view in views[1:]:
            reduce_into(op, out, view)
        finish_average(op, out, self.size)

    # ------------------------------------------------------------------ collectives
    @_guarded("all_reduce")
    def all_reduce(self, array: np.ndarray, op: ReduceOp) -> None:
        """Small: everyone publishes and reduces every slot. Large, per piece: publish
        the chunks the others reduce, reduce mine from every slot, publish it, copy theirs."""
        flat = array.reshape(-1)
        if flat.nbytes <= SMALL_BYTES:
            self._small_round(flat, flat.nbytes, flat.dtype, NO_ROOT, _OP_CODES[op])
            self._reduce_slots_into(flat, self._small_slot_views(flat.nbytes, flat.dtype), op)
            return
        self._large_begin(flat.nbytes, flat.dtype, NO_ROOT, _OP_CODES[op])
        r = self.rank
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            part = flat[lo:hi]
            bounds = chunk_bounds(hi - lo, self.size)
            slots = [self._slot(k, flat.dtype, hi - lo) for k in range(self.size)]
            c0, c1 = bounds[r], bounds[r + 1]
            self._barrier_all()  # nobody still reads what the slots held before
            slots[r][:c0] = part[:c0]  # the others need only the chunks they reduce
            slots[r][c1:] = part[c1:]
            self._barrier_all()
            acc = part[c0:c1]
            for k in range(self.size):
                if k != r:
                    reduce_into(op, acc, slots[k][c0:c1])
            finish_average(op, acc, self.size)
            slots[r][c0:c1] = acc
            self._barrier_all()
            for k in range(self.size):
                if k != r:
                    part[bounds[k] : bounds[k + 1]] = slots[k][bounds[k] : bounds[k + 1]]

    @_guarded("broadcast")
    def broadcast(self, array: np.ndarray, root: int) -> None:
        """The root publishes, the others copy; in pieces of one slot."""
        flat = array.reshape(-1)
        if flat.nbytes <= SMALL_BYTES:
            slots = self._small_round(flat if self.rank == root else None, flat.nbytes, flat.dtype, root)
            if self.rank != root:
                flat.view(np.uint8)[...] = slots[root, : flat.nbytes]
            return
        self._large_begin(flat.nbytes, flat.dtype, root)
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            self._barrier_all()
            if self.rank == root:
                self._slot(root, flat.dtype, hi - lo)[...] = flat[lo:hi]
            self._barrier_all()
            if self.rank != root:
                flat[lo:hi] = self._slot(root, flat.dtype, hi - lo)

    @_guarded("all_gather")
    def all_gather(self, outputs: list[np.ndarray], array: np.ndarray) -> None:
        """Everyone publishes its array, everyone copies every slot into its outputs."""
        flat = array.reshape(-1)
        outs = [o.reshape(-1) for o in outputs]
        if flat.nbytes <= SMALL_BYTES:
            slots = self._small_round(flat, flat.nbytes, flat.dtype)
            for k in range(self.size):
                outs[k].view(np.uint8)[...] = slots[k, : flat.nbytes]
            return
        self._large_begin(flat.nbytes, flat.dtype)
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            self._barrier_all()
            self._slot(self.rank, flat.dtype, hi - lo)[...] = flat[lo:hi]
            self._barrier_all()
            for k in range(self.size):
                outs[k][lo:hi] = self._slot(k, flat.dtype, hi - lo)

    @_guarded("reduce")
    def reduce(self, array: np.ndarray, root: int, op: ReduceOp) -> None:
        """Everyone publishes; each reduces its chunk in its own slot; the root collects.

        Non-root arrays are only read, never written.
        """
        flat = array.reshape(-1)
        if flat.nbytes <= SMALL_BYTES:
            small = self._small_round(flat, flat.nbytes, flat.dtype, root, _OP_CODES[op])
            if self.rank == root:
                self._reduce_slots_into(flat, [small[k, : flat.nbytes].view(flat.dtype) for k in range(self.size)], op)
            return
        self._large_begin(flat.nbytes, flat.dtype, root, _OP_CODES[op])
        r = self.rank
        for lo, hi in self._pieces(flat.size, flat.itemsize):
            bounds = chunk_bounds(hi - lo, self.size)
            slots = [self._slot(k, flat.dtype, hi - lo) for k in range(self.size)]
            self._barrier_all()
            slots[r][...] = flat[lo:hi]
            self._barrier_all()
            c0, c1 = bounds[r], bounds[r + 1]
            for k in range(self.size):
                if k != r:
                    reduce_into(op, slots[r][c0:c1], slots[k][c0:c1])
            finish_average(op, slots[r][c0:c1], self.size)
            self._barrier_all()
            if r == root:
                for k in range(self.size):
                    flat[lo + bounds[k] : lo + bounds[k + 1]] = slots[k][bounds[k] : bounds[k + 1]]

    @_guarded("reduce_scatter")
    def reduce_scatter(self, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None:
        """Each rank publishes what the others reduce; rank r reduces every input[r]."""
        out = output.reshape(-1)
        ins = [i.reshape(-1) for i in inputs]
        n, r = self.size, self.rank
        self._large_begin(out.nbytes, out.dtype, NO_ROOT, _OP_CODES[op])
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

    @_guarded("all_to_all")
    def all_to_all(self, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None:
        """Each rank publishes inputs[j] at place j of its slot; rank r copies place r of each."""
        outs = [o.reshape(-1) for o in outputs]
        ins = [i.reshape(-1) for i in inputs]
        n, r = self.size, self.rank
        dtype = ins[0].dtype
        self._large_begin(ins[0].nbytes, dtype)
        outs[r][...] = ins[r]
        for lo, hi in self._pieces(ins[0].size, dtype.itemsize, parts=n):
            count = hi - lo
            self._barrier_all()
            for j in range(n):
                if j != r:
                    self._slot(r, dtype, count, offset=j * count)[...] = ins[j][lo:hi]
            self._barrier_all()
            for k in range(n):
                if k != r:
                    outs[k][lo:hi] = self._slot(k, dtype, count, offset=r * count)


__all__ = ["ENV_SHM", "SharedMemoryArena", "all_on_one_host", "host_identity", "shm_possible"]
