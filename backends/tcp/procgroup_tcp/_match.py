"""Matching frames to receives: the posted receives and the unexpected queue.

A reader thread asks :meth:`Matcher.match_incoming` where a frame lands: the first
posted receive with its tag and source (or any source), else a new buffer on the
unexpected queue, which a later receive takes before it would post. A receive is a
:class:`PostedRecv`, itself the Work the caller waits on (one object per message).
Sizes and dtypes must match exactly; a mismatch fails that receive only (a frame
larger than the buffer: PeerError naming the sender, smaller or of another dtype:
InvalidArrayError). A collective's receive also compares the frame's fingerprint
with its own; a tag found mismatched is *dead* for a while: its receives fail with
the MismatchError and its late frames are dropped (see :meth:`Matcher.poison`).

A receive from one rank that waits longer than ``PROBE_AFTER`` calls the matcher's
``stalled`` hook, then again at doubling intervals (up to ``PROBE_EVERY``): the channel
sends that rank a probe with the collective's fingerprint, so ranks that disagree while
each of them only receives (reduce or gather with two different roots) find it in
milliseconds instead of waiting out the timeout. A wait that ends in time costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from procgroup.backend import CompletedWork, Work, fresh
from procgroup.errors import CommTimeoutError, InvalidArrayError, PeerError

from ._wire import dtype_code, dtype_of

#: a receive waiting this long (seconds) probes its sender, then at doubling intervals
PROBE_AFTER = 0.02
#: the longest interval between two probes of one waiting receive
PROBE_EVERY = 1.0


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


class PostedRecv(Work):
    """A receive waiting for its frame, filled by a reader thread; the caller's Work.

    ``wait(timeout)`` with a timeout only bounds that wait: the receive stays posted and
    a later wait can still get it. Running out the channel's own timeout cancels the
    receive for good. A receive whose payload is already streaming in is not
    cancelled; its reader finishes it, or fails it if the peer dies.
    """

    op = "irecv"
    __slots__ = ("_matcher", "done", "dtype", "error", "sender", "src", "tag", "view")

    def __init__(self, matcher: Matcher, view: memoryview, src: int | None, tag: int, dtype: np.dtype) -> None:
        self._matcher = matcher
        self.view = view
        self.src = src
        self.tag = tag
        self.dtype = dtype
        self.done = threading.Event()
        self.sender = -1
        self.error: BaseException | None = None

    # ------------------------------------------------------------ the reader's side
    def admit(self, nbytes: int, dtype_char: bytes, sender: int) -> memoryview:
        check_size(nbytes, dtype_char, self.view, self.dtype, sender)
        return self.view

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        self.sender = sender
        self.error = error
        self.done.set()
        wake = self._matcher.wake
        if wake is not None:
            wake()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.finish(-1, error)

    # ------------------------------------------------------------ the caller's side
    def is_completed(self) -> bool:
        if not self.done.is_set() and self._matcher.progress is not None:
            self._matcher.progress()
        return self.done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        m = self._matcher
        limit = m.timeout if timeout is None else timeout
        if self._wait_probing(limit):
            if self.error is not None:
                raise fresh(self.error)
            return True
        who = "any rank" if self.src is None else f"rank {m.global_rank(self.src)}"
        ranks = [] if self.src is None else [m.global_rank(self.src)]
        exc = CommTimeoutError(f"recv from {who} (tag {self.tag}) timed out after {limit}s", op="recv", ranks=ranks)
        if timeout is not None:
            raise exc
        if m.cancel(self):
            self.finish(-1, exc)
            raise exc
        # matched: the reader is filling the buffer and bounds a stalled peer itself
        if not m.wait_event(self.done, m.timeout):
            raise exc
        if self.error is not None:
            raise fresh(self.error)
        return True

    def _wait_probing(self, limit: float) -> bool:
        """Wait up to ``limit`` seconds; past ``PROBE_AFTER``, call ``stalled`` now and then
        (for as long as it returns True: only a collective's receive from one rank probes)."""
        m = self._matcher
        stalled = m.stalled
        if stalled is None or self.src is None or limit <= PROBE_AFTER:
            return m.wait_event(self.done, limit)
        deadline = time.monotonic() + limit
        step = PROBE_AFTER
        while not m.wait_event(self.done, step):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not stalled(self):
                return m.wait_event(self.done, left)
            step = min(step * 2, PROBE_EVERY, left)
        return True

    def exception(self) -> BaseException | None:
        return self.error if self.done.is_set() else None

    def result(self) -> Any:
        return self.sender if self.done.is_set() and self.error is None else None


class Unexpected:
    """A frame that arrived before its receive was posted; its payload is kept here."""

    __slots__ = ("data", "done", "dtype_char", "error", "fp", "src", "tag")

    def __init__(self, src: int, tag: int, nbytes: int, dtype_char: bytes, fp: bytes) -> None:
        self.src = src
        self.tag = tag
        self.fp = fp
        self.data = np.empty(nbytes, dtype=np.uint8)  # not zero-filled: it is overwritten
        self.dtype_char = dtype_char
        self.done = threading.Event()
        self.error: BaseException | None = None

    def admit(self, nbytes: int, dtype_char: bytes, sender: int) -> memoryview:
        return memoryview(self.data)  # type: ignore[arg-type]

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.finish(self.src, error)


class Discard:
    """Where a frame of a dead tag goes: its payload is read and dropped."""

    def admit(self, nbytes: int, dtype_char: bytes, sender: int) -> memoryview:
        raise _DROPPED

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        pass

    def fail(self, error: BaseException) -> None:
        pass


_DROPPED = LookupError("dropped: the frame belongs to a collective that already failed")
DISCARD = Discard()
#: A tag found mismatched stays dead this long (its late frames are dropped meanwhile).
DEAD_TAG_SECONDS = 30.0


class Matcher:
    """The posted receives and the unexpected queue of one channel, under one lock.

    ``check(src)`` is the channel's say on a new receive: it raises when the channel
    is broken or closed, or ``src`` has left; it runs under the lock, so a failure
    reported at the same time either sees the receive or refuses it.
    """

    def __init__(self, timeout: float, global_rank: Callable[[int], int],
                 check: Callable[[int | None], None]) -> None:
        self.timeout = timeout
        self.global_rank = global_rank
        self._check = check
        self._lock = threading.Lock()
        self._posted: list[PostedRecv] = []
        self._unexpected: list[Unexpected] = []
        #: set when frames also arrive through shared memory: a wait must then drive
        #: that progress itself (nothing else reads the rings), see ``_p2p``
        self.progress: Callable[[], None] | None = None
        #: with ``progress``: the wait that drives it, and how a landing wakes a sleeping waiter
        self.wait_until: Callable[[Callable[[], bool], float], bool] | None = None
        self.wake: Callable[[], None] | None = None
        #: tag -> (the MismatchError of its collective, until when the tag stays dead)
        self.dead: dict[int, tuple[BaseException, float]] = {}
        #: called with a receive that has waited a while; False: it need not be called again
        self.stalled: Callable[[PostedRecv], bool] | None = None

    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes,
                       fp: bytes) -> PostedRecv | Unexpected | Discard:
        """The posted receive a frame belongs to, or a new entry on the unexpected queue."""
        with self._lock:
            if self.dead and tag in self.dead:
                return DISCARD
            for i, req in enumerate(self._posted):
                if req.tag == tag and (req.src is None or req.src == src):
                    del self._posted[i]
                    return req
            ux = Unexpected(src, tag, nbytes, dtype_char, fp)
            self._unexpected.append(ux)
            return ux

    def post(self, view: memoryview, src: int | None, tag: int, dtype: np.dtype, fp: bytes | None = None,
             mismatched: Callable[[int, bytes, bytes, Unexpected], BaseException] | None = None) -> Work:
        """A receive: served from the unexpected queue when its frame came first.

        ``fp``: the fingerprint of the collective posting it; a queued frame carrying
        another is refused with ``mismatched(tag, fp, frame.fp, frame)``.
        """
        with self._lock:
            if self.dead and tag in self.dead:
                raise fresh(self.dead[tag][0])
            for i, ux in enumerate(self._unexpected):
                if ux.tag == tag and (src is None or ux.src == src):
                    del self._unexpected[i]
                    break
            else:
                # what a departed peer sent before its goodbye is still delivered above
                self._check(src)
                req = PostedRecv(self, view, src, tag, dtype)
                self._posted.append(req)
                return req
        if fp is not None and ux.fp != fp and mismatched is not None:
            raise mismatched(tag, fp, ux.fp, ux)
        self._deliver(ux, view, dtype)
        return CompletedWork("irecv", ux.src)

    def _deliver(self, ux: Unexpected, view: memoryview, dtype: np.dtype) -> None:
        # refuse a frame of the wrong size at once, not after its payload has arrived
        check_size(ux.data.nbytes, ux.dtype_char, view, dtype, self.global_rank(ux.src))
        if not self.wait_event(ux.done, self.timeout):
            raise CommTimeoutError(
                f"message from rank {self.global_rank(ux.src)} did not finish arriving within {self.timeout}s",
                op="recv", ranks=[self.global_rank(ux.src)],
            )
        if ux.error is not None:
            raise fresh(ux.error)
        check_size(ux.data.nbytes, ux.dtype_char, view, dtype, self.global_rank(ux.src))
        view[:] = memoryview(ux.data)  # type: ignore[arg-type]

    def wait_event(self, done: threading.Event, timeout: float) -> bool:
        """``done.wait(timeout)``, driving the shared-memory progress meanwhile when there is one."""
        wait_until = self.wait_until
        if wait_until is None or done.is_set():
            return done.wait(timeout)
        return wait_until(done.is_set, timeout)

    def cancel(self, req: PostedRecv) -> bool:
        """Withdraw a receive no frame has matched yet; False when one has."""
        with self._lock:
            if req in self._posted:
                self._posted.remove(req)
                return True
            return False

    def poison(self, tag: int, exc: BaseException) -> bool:
        """The collective of ``tag`` failed with ``exc`` (a MismatchError): fail its
        receives now and later, drop its frames. False when it was dead already."""
        now = time.monotonic()
        with self._lock:
            if tag in self.dead:
                return False
            for old in [t for t, (_, until) in self.dead.items() if until < now]:
                del self.dead[old]
            self.dead[tag] = (exc, now + DEAD_TAG_SECONDS)
            waiting = [r for r in self._posted if r.tag == tag]
            self._posted = [r for r in self._posted if r.tag != tag]
            self._unexpected = [u for u in self._unexpected if u.tag != tag]
        for req in waiting:
            req.fail(fresh(exc))
        return True

    def queued(self, tag: int) -> Unexpected | None:
        """The first frame still queued under ``tag`` (its collective has ended), or None."""
        if not self._unexpected:  # the common case; a frame queued meanwhile is checked as it lands
            return None
        with self._lock:
            for ux in self._unexpected:
                if ux.tag == tag:
                    return ux
        return None

    def dead_error(self, tag: int) -> BaseException | None:
        """The MismatchError ``tag`` was poisoned with, or None."""
        entry = self.dead.get(tag)
        return None if entry is None else fresh(entry[0])

    def fail_from(self, src: int, exc: BaseException) -> None:
        """Fail the receives that wait on ``src`` alone (it said goodbye)."""
        with self._lock:
            waiting = [r for r in self._posted if r.src == src]
            self._posted = [r for r in self._posted if r.src != src]
        for req in waiting:
            req.finish(src, exc)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every posted receive and every payload still arriving."""
        with self._lock:
            posted, self._posted = self._posted, []
            pending = [u for u in self._unexpected if not u.done.is_set()]
        for req in posted:
            req.fail(exc)
        for ux in pending:
            ux.fail(exc)


__all__ = ["DEAD_TAG_SECONDS", "DISCARD", "PROBE_AFTER", "PROBE_EVERY", "Discard", "Matcher", "PostedRecv", "Unexpected",
           "check_size"]
