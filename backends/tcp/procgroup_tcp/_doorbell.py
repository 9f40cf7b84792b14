"""A doorbell in shared memory: a waiting rank sleeps in the kernel until a peer rings it.

A rank that has spun briefly without its message arriving sleeps on a futex word in its
own inbox (FUTEX_WAIT on a shared mapping, through libc's ``syscall``); a peer that
writes a record, an acknowledgement or frees ring space bumps the word and, when
someone sleeps there, wakes it (FUTEX_WAKE). On a busy machine the kernel then runs the
woken rank at once, where a polling rank would wait for its turn. Each sleep is bounded
(``NAP_S``), so a missed wake-up (the two sides' stores crossing) costs at most one nap,
and the waiter's other checks (socket peers, failures, the deadline) run between naps.
Without the syscall (not x86-64 Linux) the sleep is a plain nap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
import threading
import time

import numpy as np

#: the doorbell block at the start of an inbox: the futex word, then (a cache line on) the sleepers flag
BLOCK_BYTES = 4096
_SEQ, _SLEEPERS = 0, 16  # 32-bit word indexes
SLEEPERS_WORD = _SLEEPERS
#: the longest sleep between two looks at everything else
NAP_S = 1e-3
_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]  # private in typeshed, real at run time
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.syscall
    except (OSError, AttributeError):
        return None


_syscall = _load()


class Doorbell:
    """One rank's doorbell, as mapped in this process (its own, or a peer's)."""

    def __init__(self, block: memoryview) -> None:
        self._words = block[:BLOCK_BYTES].cast("I")
        #: the block's 32-bit words: ``words[SLEEPERS_WORD]`` is what :meth:`wake` reads (a
        #: sender's fast path reads it inline, then calls :meth:`ring` only when it is set)
        self.words = self._words
        self._addr = int(np.frombuffer(block, dtype=np.uint8, count=1).ctypes.data)
        self._lock = threading.Lock()
        self._sleepers = 0  # this process's threads asleep on it (only the owner sleeps)

    def ring(self) -> None:
        """Something changed for the owner: wake it if it sleeps."""
        w = self._words
        w[_SEQ] = (w[_SEQ] + 1) & 0xFFFFFFFF
        if w[_SLEEPERS] and _syscall is not None:
            _syscall(
                ctypes.c_long(_SYS_FUTEX),
                ctypes.c_void_p(self._addr),
                ctypes.c_long(_FUTEX_WAKE),
                ctypes.c_long(0x7FFFFFFF),
                None,
                None,
                ctypes.c_long(0),
            )

    def wake(self) -> None:
        """:meth:`ring` for a writer that released a lock after its write (a locked
        instruction: a full fence on x86-64): wake the owner only if it sleeps. An owner
        going to sleep raises its sleepers flag and releases a lock too before its last
        look at ``ready()``, so of the two one sees the other's store: either this sees
        the flag and rings, or the owner sees the write and does not sleep."""
        try:
            if self._words[_SLEEPERS]:
                self.ring()
        except ValueError:  # released by the channel's close after the write: nobody to wake
            pass

    def sleep(self, ready: object, seconds: float) -> None:
        """Sleep up to ``seconds`` unless rung; ``ready()`` is tested once more after the
        sleepers flag is up, so a ring that came just before is not slept through."""
        w = self._words
        seen = w[_SEQ]
        with self._lock:  # its release fences the flag's store before ready() reads (wake())
            self._sleepers += 1
            w[_SLEEPERS] = 1
        try:
            if ready():  # type: ignore[operator]  # ready is the caller's check, typed loosely
                return
            if _syscall is None:
                time.sleep(seconds)
                return
            ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
            _syscall(
                ctypes.c_long(_SYS_FUTEX),
                ctypes.c_void_p(self._addr),
                ctypes.c_long(_FUTEX_WAIT),
                ctypes.c_long(seen),
                ctypes.byref(ts),
                None,
                ctypes.c_long(0),
            )
        finally:
            with self._lock:
                self._sleepers -= 1
                if not self._sleepers:
                    w[_SLEEPERS] = 0

    def release(self) -> None:
        self._words.release()


__all__ = ["BLOCK_BYTES", "NAP_S", "SLEEPERS_WORD", "Doorbell"]
