"""Progress on the sockets: the waiting caller reads its own frames, a reader thread the rest.

Why: handing each frame from a reader thread to the caller waiting for it costs a thread
wake-up and a GIL transfer per message, more than the rest of the path together. So, as in MPICH's progress engine, a caller that waits for a receive
reads and dispatches the frames of the peer it waits on itself (any-source: of every
peer, through ``poll``), and each peer's reader thread reads only while no caller does.
An idle rank thereby still takes in unexpected messages, heartbeats, control frames,
mismatch notices and the news of a death.

Who may read a peer's socket is decided by its reader's ``gate``, a lock held for whole frames
(a frame is never split between two readers). The reader thread must not fight a
caller for it (waking on every frame would contend for the GIL with the caller): when it finds the gate held, or a caller that read within
``quiet`` seconds, it parks on the engine's condition and looks again every ``quiet``
seconds (2 ms per peer, ``quiet_seconds``), so ranks exchanging messages back to back see
their readers wake a few hundred times a second in all, not once per frame. Nothing is stranded when data arrives just as the caller
leaves: the parked thread looks again within ``quiet`` (or the next caller reads it).

Sends: a send that does not go out at once (the peer's kernel buffer is full) unparks
every reader thread of the channel while it blocks, so two ranks sending large
messages to each other keep draining each other, and the segments of a pipelined
collective land while the caller sends the next one, as before.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ._peer_state import PeerState

if TYPE_CHECKING:
    from ._conn import Peer

_now = time.monotonic
_OPEN = PeerState.OPEN
_yield = getattr(os, "sched_yield", lambda: None)

#: What ``Peer.read_frame`` returns: a frame was read and dispatched; none had started
#: (nothing there, or the tick passed); the peer will send no more (goodbye, EOF, error);
#: the caller's own unposted receive landed (``TcpChannel.do_recv``).
FRAME, NOTHING, OVER, LANDED = 1, 0, -1, 2
#: The kernel's SO_RCVTIMEO/SO_SNDTIMEO on the data sockets: a caller blocked in a read
#: or a write looks up this often (a receive failed by another thread, a deadline).
TICK_S = 0.01
#: A peer's reader thread stays parked this long after a caller last read that peer, per
#: peer with a reader thread (``quiet_seconds``).
QUIET_S = 0.002
#: A caller waiting for a gate another thread holds looks at its receive this often.
GATE_SLICE_S = 0.001
#: A blocking read first watches the socket this long (``FrameReader._spin_then_read``):
#: a message that comes meanwhile is taken with no sleep and no wake-up (a scheduler round
#: trip on each side); the shared-memory waits spin as long.
SPIN_S = 100e-6
#: The reader thread's poll: it wakes at least this often (ms) to see the peer closing.
_POLL_MS = 1000
_POLLIN = select.POLLIN


def spin_seconds(ranks_on_host: int) -> float:
    """How long a blocking read watches its socket first: ``SPIN_S``, or nothing when this
    host's ranks outnumber its cores (spinning would take the core the awaited rank needs;
    the runs: docs/history.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return SPIN_S if ranks_on_host <= cores else 0.0


def quiet_seconds(peers: int) -> float:
    """How long a reader thread stands back after a caller read its peer: ``QUIET_S`` for
    each peer that has a reader thread, so that a rank's parked readers together look
    again about 500 times a second whatever the world size. Each look is a wake-up that
    contends for the GIL, so the more peers, the less often each looks (the runs:
    docs/history.md)."""
    return QUIET_S * max(1, peers)


class Waiter(Protocol):
    """A posted receive, as the engine sees it: done once ``completed`` is set."""

    completed: bool


class Engine:
    """One channel's progress policy: when reader threads read, and how callers drive."""

    def __init__(self, quiet: float = QUIET_S) -> None:
        self.quiet = quiet
        self.cond = threading.Condition(threading.Lock())
        #: sends that are blocked on a full kernel buffer now: every reader reads meanwhile
        self.blocked_sends = 0
        self.stopped = False

    # ------------------------------------------------------------------ sends
    def send_blocks(self) -> None:
        """A send could not finish at once: unpark every reader thread until it has."""
        with self.cond:
            self.blocked_sends += 1
            self.cond.notify_all()

    def send_unblocks(self) -> None:
        with self.cond:
            self.blocked_sends -= 1

    def resume(self, peers: Sequence[Peer]) -> None:
        """No caller will read ``peers`` again: their reader threads go back to work now."""
        with self.cond:
            for peer in peers:
                peer.reader.driven_at = 0.0
            self.cond.notify_all()

    def stop(self) -> None:
        """The channel closes: parked reader threads go back to their sockets (to see EOF)."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    # ------------------------------------------------------------------ the reader thread
    def background(self, peer: Peer) -> None:
        """A peer's reader thread: read its frames while no caller does."""
        reader = peer.reader
        poller = select.poll()
        poller.register(reader.sock, _POLLIN)
        gate = reader.gate
        while not peer.state.over:
            if reader.parked:
                self._stand_back(peer)
                continue
            try:
                if not poller.poll(_POLL_MS):
                    continue
            except (OSError, ValueError):  # the socket was closed under us: reading reports it
                pass
            if not self.blocked_sends and (gate.locked() or _now() - reader.driven_at < self.quiet):
                reader.parked = True  # a caller reads this peer: stand back, do not contend
                continue
            if not gate.acquire(timeout=TICK_S):
                continue
            try:
                reader.read_frame(False)  # the frame may have gone to a caller meanwhile: never block
                reader.drain_buffered()
            finally:
                gate.release()

    def _stand_back(self, peer: Peer) -> None:
        """Park until no caller has read ``peer`` for ``quiet`` seconds (or a send blocks).

        Leaving is done under the gate: a caller that let go of the gate while this thread
        was parked may have left whole frames in the buffer (``FrameReader.let_go``), which
        ``poll`` would never report; they are dispatched here, before polling again."""
        reader = peer.reader
        cond, quiet, gate = self.cond, self.quiet, reader.gate
        with cond:
            while not (self.blocked_sends or self.stopped or peer.state is not _OPEN):
                if not gate.locked() and _now() - reader.driven_at >= quiet:
                    break
                cond.wait(quiet)
        # a caller that took the gate meanwhile keeps this thread parked (never wait for
        # it: that would wake this thread as the caller lets go), unless it must read now
        urgent = self.blocked_sends or self.stopped or peer.state is not _OPEN
        if gate.acquire(timeout=TICK_S) if urgent else gate.acquire(False):
            try:
                reader.drain_buffered()
                reader.parked = False
            finally:
                gate.release()

    # ------------------------------------------------------------------ callers
    def drive(self, peer: Peer, req: Waiter, deadline: float) -> None:
        """Read ``peer``'s frames on the caller's thread until ``req`` completes or
        ``deadline`` passes. Frames for other receives are dispatched on the way (to
        their posted receive, or the unexpected queue). The gate is held meanwhile, so
        the reader thread stands back."""
        reader = peer.reader
        gate = reader.gate
        while not req.completed:
            if peer.state.over or not gate.acquire(False):
                remaining = deadline - _now()
                if remaining <= 0:
                    return
                if peer.state.over:  # nothing more comes from it: whoever saw that fails the receive
                    time.sleep(min(remaining, GATE_SLICE_S))
                    continue
                # a reader is in the middle of a frame, maybe ours: look again soon
                if not gate.acquire(timeout=min(remaining, GATE_SLICE_S)):
                    continue
            try:
                while not req.completed and not peer.state.over:
                    remaining = deadline - _now()
                    if remaining <= 0:
                        return
                    if remaining >= TICK_S:
                        reader.read_frame(True)
                    elif not reader.wait_readable(remaining):  # a short wait must not overshoot by a tick
                        return
                    else:
                        reader.read_frame(False)
            finally:
                reader.let_go()
                reader.driven_at = _now()
                gate.release()

    def drive_any(self, peers: Sequence[Peer], req: Waiter, deadline: float) -> None:
        """An any-source wait: read whichever of ``peers`` has a frame, until ``req`` completes."""
        while not req.completed:
            remaining = deadline - _now()
            if remaining <= 0:
                return
            live = [p.reader for p in peers if not p.state.over]
            if not live:
                time.sleep(min(remaining, GATE_SLICE_S))
                continue
            buffered = [(r.fileno, 0) for r in live if r.has_frame]  # poll cannot see those
            poller = select.poll()
            for r in live:
                poller.register(r.fileno, _POLLIN)
            by_fd = {r.fileno: r for r in live}
            try:
                ready = buffered or poller.poll(0)
                if not ready and live[0].spin:  # watch the sockets a while before sleeping
                    end = min(_now() + live[0].spin, deadline)
                    while not ready and _now() < end:
                        _yield()  # a process sharing this core runs meanwhile
                        ready = poller.poll(0)
                if not ready:
                    ready = poller.poll(max(int(min(remaining, TICK_S) * 1000), 1))
            except (OSError, ValueError):
                ready = [(r.fileno, 0) for r in live]  # a socket closed: reading it reports that
            while ready and not req.completed:
                for fd, _ in ready:
                    reader = by_fd.get(fd)
                    if reader is None or not (reader.gate.acquire(False) or reader.gate.acquire(timeout=GATE_SLICE_S)):
                        continue
                    try:
                        reader.read_frame(False)
                        reader.let_go()
                    finally:
                        reader.driven_at = _now()
                        reader.gate.release()
                    if req.completed:
                        return
                try:
                    ready = poller.poll(0)
                except (OSError, ValueError):
                    break

    def poke(self, peers: Sequence[Peer]) -> None:
        """``is_completed``, and a wait for a large receive: the reader threads of ``peers``
        go (or stay) at work, so what arrives lands while the caller does something else
        (MPI_Test's progress). Not read here: a large payload in flight would hold the
        caller until all of it has come, where a pipelined collective wants to send its
        next segment meanwhile."""
        parked = False
        for peer in peers:
            reader = peer.reader
            reader.driven_at = 0.0  # no caller reads it now: the thread must not stand back
            parked = parked or reader.parked
        if parked:
            with self.cond:
                self.cond.notify_all()


__all__ = ["FRAME", "GATE_SLICE_S", "LANDED", "NOTHING", "OVER", "QUIET_S", "SPIN_S", "TICK_S", "Engine", "Waiter",
           "quiet_seconds", "spin_seconds"]
