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

How a receive waits is the matcher's :class:`Progress` strategy, one object chosen by
the channel once its set-up is done (``_strategies``): the caller reads the sockets
itself, or drives the shared-memory rings and sleeps on the doorbell, or (a channel of
one) just waits. The matcher itself knows no transport.

A receive from one rank that waits longer than ``PROBE_AFTER`` calls the matcher's
``probe`` (given at construction), then again at doubling intervals (up to ``PROBE_EVERY``): the channel
sends that rank a probe with the collective's fingerprint, so ranks that disagree while
each of them only receives (reduce or gather with two different roots) find it in
milliseconds instead of waiting out the timeout. A wait that ends in time costs nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from procgroup.backend import CompletedWork, Work, fresh
from procgroup.errors import CommTimeoutError, WorkCancelledError

from ._wire import check_size

#: a receive waiting this long (seconds) probes its sender, then at doubling intervals
PROBE_AFTER = 0.02
#: the longest interval between two probes of one waiting receive
PROBE_EVERY = 1.0


class PostedRecv(Work):
    """A receive waiting for its frame; the caller's Work. Whoever reads the frame (the
    waiting caller itself, another caller, or a reader thread) fills the buffer.

    ``wait(timeout)`` with a timeout only bounds that wait: the receive stays posted and
    a later wait can still get it. Running out the channel's own timeout cancels the
    receive for good. A receive whose payload is already streaming in is not
    cancelled; its reader finishes it, or fails it if the peer dies.
    No Event per receive: a waiting caller reads the frames itself (``SocketProgress``),
    so it looks at ``completed`` after each frame instead of being woken.
    """

    op = "irecv"
    __slots__ = ("_matcher", "completed", "dtype", "error", "event", "sender", "src", "tag", "view")

    def __init__(self, matcher: Matcher, view: memoryview, src: int | None, tag: int, dtype: np.dtype) -> None:
        self._matcher = matcher
        self.view = view
        self.src = src
        self.tag = tag
        self.dtype = dtype
        self.completed = False
        self.sender = -1
        self.error: BaseException | None = None
        self.event: threading.Event | None = None  # made by a waiter that sleeps (a large receive)

    # ------------------------------------------------------------ the reader's side
    def admit(self, nbytes: int, dtype_char: bytes, sender: int) -> memoryview:
        check_size(nbytes, dtype_char, self.view, self.dtype, sender)
        return self.view

    def finish(self, sender: int, error: BaseException | None = None) -> None:
        self.sender = sender
        self.error = error
        self.completed = True
        event = self.event  # read after ``completed`` is set: see SocketProgress._await_reader
        if event is not None:
            event.set()
        self._matcher.progress.wake()

    def fail(self, error: BaseException) -> None:
        if not self.completed:
            self.finish(-1, error)

    def is_done(self) -> bool:
        return self.completed

    # ------------------------------------------------------------ the caller's side
    def is_completed(self) -> bool:
        if not self.completed:
            self._matcher.progress.poke(self)
        return self.completed

    def wait(self, timeout: float | None = None) -> bool:
        if not self.completed:
            m = self._matcher
            limit = m.timeout if timeout is None else timeout
            if not m.settle(self, limit):
                self.timed_out(limit, timeout is not None)
        if self.error is not None:
            raise fresh(self.error)
        return True

    def timed_out(self, limit: float, bounded: bool) -> None:
        """The wait ran out ``limit`` seconds: raise CommTimeoutError (withdrawing the
        receive unless ``bounded``, a wait with its own timeout), or, when a frame has
        matched it already, wait for that payload (its reader bounds a stalled peer)."""
        m = self._matcher
        who = "any rank" if self.src is None else f"rank {m.global_rank(self.src)}"
        ranks = [] if self.src is None else [m.global_rank(self.src)]
        exc = CommTimeoutError(f"recv from {who} (tag {self.tag}) timed out after {limit}s", op="recv", ranks=ranks)
        if bounded:
            raise exc
        if m.cancel(self):
            self.finish(-1, exc)
            raise exc
        if not m.settle(self, m.timeout):
            raise exc

    def exception(self) -> BaseException | None:
        return self.error if self.completed else None

    def _await_limit(self) -> float:
        return self._matcher.timeout  # ``await`` polls as long as a blocking wait() waits

    def result(self) -> Any:
        return self.sender if self.completed and self.error is None else None

    def cancel(self) -> bool:
        """Withdraw the receive unless a frame has matched it (it is then read to the end)."""
        if self.completed or not self._matcher.cancel(self):
            return isinstance(self.error, WorkCancelledError)
        m = self._matcher
        who = "any rank" if self.src is None else f"rank {m.global_rank(self.src)}"
        self.finish(-1, WorkCancelledError(f"recv from {who} (tag {self.tag}) was withdrawn with Work.cancel()"))
        return True


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
        return memoryview(self.data)

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


class Progress(Protocol):
    """How the receives of one channel make progress while they wait: the one transport
    strategy the matcher is given (``Matcher.start``), see ``_strategies``."""

    def wait(self, req: PostedRecv, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``req`` to complete, making progress; True once it has."""

    def poke(self, req: PostedRecv) -> None:
        """``is_completed``: make what progress can be made without blocking."""

    def wait_event(self, done: threading.Event, timeout: float) -> bool:
        """Wait for a queued frame still arriving (its reader sets ``done``)."""

    def wake(self) -> None:
        """A receive landed: wake a waiter that sleeps on the transport."""


class Idle:
    """No transport to drive (a channel of one, and a channel still setting up: its
    reader threads land every frame meanwhile): a wait looks at the receive every
    millisecond."""

    def wait(self, req: PostedRecv, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not req.completed and time.monotonic() < deadline:
            time.sleep(0.001)
        return req.completed

    def poke(self, req: PostedRecv) -> None:
        pass

    def wait_event(self, done: threading.Event, timeout: float) -> bool:
        return done.wait(timeout)

    def wake(self) -> None:
        pass


IDLE = Idle()


class Matcher:
    """The posted receives and the unexpected queue of one channel, under one lock.

    ``check(src, tag)`` is the channel's say on a new receive: it raises when the
    channel is closed, ``src`` has left or died, or the group of ``tag`` refuses it
    (``_scope``); it runs under the lock, so a failure reported at the same time either
    sees the receive or refuses it. An any-source receive asks before it takes a queued
    frame too (a group with an unacknowledged failure refuses it, as ULFM does). ``probe(req)``
    is called with a receive from one rank that has waited a while (False: it need
    not be called again). ``progress`` is the transport strategy, :data:`IDLE` until
    the channel calls :meth:`start` at the end of its set-up.
    """

    def __init__(self, timeout: float, global_rank: Callable[[int], int],
                 check: Callable[[int | None, int], None],
                 probe: Callable[[PostedRecv], bool] | None = None) -> None:
        self.timeout = timeout
        self.global_rank = global_rank
        self._check = check
        self._probe = probe
        self.progress: Progress = IDLE
        self._lock = threading.Lock()
        #: the posted receives and the queued frames, oldest first (changed under the lock;
        #: read without it only to see that both are empty, ``TcpChannel.do_recv``)
        self.posted: list[PostedRecv] = []
        self.unexpected: list[Unexpected] = []
        #: tag -> (the MismatchError of its collective, until when the tag stays dead)
        self.dead: dict[int, tuple[BaseException, float]] = {}

    def start(self, progress: Progress) -> None:
        """Install the transport strategy, once, when the channel's set-up is done."""
        if self.progress is not IDLE:
            raise RuntimeError("the matcher's progress strategy is chosen once")
        self.progress = progress

    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes,
                       fp: bytes) -> PostedRecv | Unexpected | Discard:
        """The posted receive a frame belongs to, or a new entry on the unexpected queue."""
        with self._lock:
            if self.dead and tag in self.dead:
                return DISCARD
            for i, req in enumerate(self.posted):
                if req.tag == tag and (req.src is None or req.src == src):
                    del self.posted[i]
                    return req
            ux = Unexpected(src, tag, nbytes, dtype_char, fp)
            self.unexpected.append(ux)
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
            if src is None:
                self._check(src, tag)
            for i, ux in enumerate(self.unexpected):
                if ux.tag == tag and (src is None or ux.src == src):
                    del self.unexpected[i]
                    break
            else:
                # what a departed peer sent before its goodbye is still delivered above
                if src is not None:
                    self._check(src, tag)
                req = PostedRecv(self, view, src, tag, dtype)
                self.posted.append(req)
                return req
        if fp is not None and ux.fp != fp and mismatched is not None:
            raise mismatched(tag, fp, ux.fp, ux)
        self._deliver(ux, view, dtype)
        return CompletedWork("irecv", ux.src)

    def unclaimed(self, src: int, tag: int) -> bool:
        """No queued frame from ``src`` with ``tag``, and no posted receive that such a frame
        would go to first: a receive taking the next one may skip the queue and the posting
        (``TcpChannel.do_recv``; its caller holds ``src``'s gate, so nobody queues meanwhile)."""
        with self._lock:
            return not (any(u.tag == tag and u.src == src for u in self.unexpected)
                        or any(r.tag == tag and (r.src is None or r.src == src) for r in self.posted))

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
        view[:] = memoryview(ux.data)

    def wait_event(self, done: threading.Event, timeout: float) -> bool:
        """Wait for a queued frame still arriving (its reader sets ``done``), making the
        strategy's progress meanwhile."""
        if done.is_set():
            return True
        return self.progress.wait_event(done, timeout)

    def settle(self, req: PostedRecv, timeout: float) -> bool:
        """Wait up to ``timeout`` for ``req``; True once it completed. Past ``PROBE_AFTER``
        it calls ``probe`` now and then (for as long as that returns True: only a
        collective's receive from one rank probes)."""
        wait = self.progress.wait
        probe = self._probe
        if probe is None or req.src is None or timeout <= PROBE_AFTER:
            return wait(req, timeout)
        deadline = time.monotonic() + timeout
        step = PROBE_AFTER
        while not wait(req, step):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not probe(req):
                return wait(req, left)
            step = min(step * 2, PROBE_EVERY, left)
        return True

    def cancel(self, req: PostedRecv) -> bool:
        """Withdraw a receive no frame has matched yet; False when one has."""
        with self._lock:
            if req in self.posted:
                self.posted.remove(req)
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
            waiting = [r for r in self.posted if r.tag == tag]
            self.posted = [r for r in self.posted if r.tag != tag]
            self.unexpected = [u for u in self.unexpected if u.tag != tag]
        for req in waiting:
            req.fail(fresh(exc))
        return True

    def queued(self, tag: int) -> Unexpected | None:
        """The first frame still queued under ``tag`` (its collective has ended), or None."""
        if not self.unexpected:  # the common case; a frame queued meanwhile is checked as it lands
            return None
        with self._lock:
            for ux in self.unexpected:
                if ux.tag == tag:
                    return ux
        return None

    def dead_error(self, tag: int) -> BaseException | None:
        """The MismatchError ``tag`` was poisoned with, or None."""
        entry = self.dead.get(tag)
        return None if entry is None else fresh(entry[0])

    def fail_from(self, src: int, exc: BaseException) -> int:
        """Fail the receives that wait on ``src`` alone (it said goodbye); how many."""
        with self._lock:
            waiting = [r for r in self.posted if r.src == src]
            self.posted = [r for r in self.posted if r.src != src]
        for req in waiting:
            req.finish(src, exc)
        return len(waiting)

    def fail_where(self, test: Callable[[int | None, int], bool], exc: BaseException) -> None:
        """Fail the posted receives for which ``test(src, tag)`` holds (a death or a revoke
        of one group: ``_scope``), and the payloads still arriving that it names."""
        with self._lock:
            failed = [r for r in self.posted if test(r.src, r.tag)]
            if not failed and not self.unexpected:
                return
            self.posted = [r for r in self.posted if not test(r.src, r.tag)]
            pending = [u for u in self.unexpected if not u.done.is_set() and test(u.src, u.tag)]
        for req in failed:
            req.fail(fresh(exc))
        for ux in pending:
            ux.fail(exc)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every posted receive and every payload still arriving."""
        with self._lock:
            posted, self.posted = self.posted, []
            pending = [u for u in self.unexpected if not u.done.is_set()]
        for req in posted:
            req.fail(exc)
        for ux in pending:
            ux.fail(exc)


__all__ = ["DEAD_TAG_SECONDS", "DISCARD", "IDLE", "PROBE_AFTER", "PROBE_EVERY", "Discard", "Idle", "Matcher",
           "PostedRecv", "Progress", "Unexpected", "check_size"]
