"""The two ways a tcp channel's receives make progress: one is chosen at set-up.

The matcher (``_match``) knows no transport: it is given one :class:`~procgroup_tcp._match.Progress`
strategy by the channel when its set-up is done (``Matcher.start``), and every wait,
``is_completed`` and landing goes through it:

* :class:`SocketProgress`, when every peer is reached over a socket: a waiting caller
  reads the frames of the peer it waits on itself (``_progress.Engine.drive``; any
  source: of every peer), a large receive has the reader thread land it instead.
* :class:`SharedMemoryProgress`, when some peer is on this host with shared-memory
  point-to-point (``_p2p``): a wait drains the rings and sleeps on this rank's doorbell;
  the reader threads read every socket and ring the doorbell when a frame lands.

A channel of one, and a channel still setting up, use :data:`~procgroup_tcp._match.IDLE`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from ._conn import Peer
from ._match import Matcher, PostedRecv
from ._p2p import ShmP2P
from ._progress import Engine

_now = time.monotonic

#: a wait on the sockets for a receive at least this large, with more receives posted
#: behind it, lets the reader thread land it (``SocketProgress._await_reader``) ...
READER_RECV_BYTES = 256 * 1024
#: ... and so does a lone receive at least this large
LONE_READER_RECV_BYTES = 1 << 20


class SocketProgress:
    """Sockets only: the waiting caller reads its own frames (see ``_progress``)."""

    def __init__(self, engine: Engine, peers: Mapping[int, Peer], matcher: Matcher) -> None:
        self._engine = engine
        self._peers = peers
        self._peer_list = list(peers.values())
        self._matcher = matcher

    def wait(self, req: PostedRecv, timeout: float) -> bool:
        """Read the frames on the caller's thread until ``req`` lands (a large one: the
        reader thread lands it, ``_await_reader``)."""
        nbytes = req.view.nbytes
        if nbytes >= READER_RECV_BYTES and (nbytes >= LONE_READER_RECV_BYTES or len(self._matcher.posted) > 1):
            return self._await_reader(req, timeout)
        src = req.src
        if src is not None:
            self._engine.drive(self._peers[src], req, _now() + timeout)
        else:
            self._engine.drive_any(self._peer_list, req, _now() + timeout)
        return req.completed

    def poke(self, req: PostedRecv) -> None:
        """``is_completed``: the reader threads land what arrives."""
        self._engine.poke(self._peer_list if req.src is None else (self._peers[req.src],))

    def wait_event(self, done: threading.Event, timeout: float) -> bool:
        return done.wait(timeout)

    def wake(self) -> None:
        """Nothing sleeps on the transport: a waiting caller reads its frames itself."""

    def _await_reader(self, req: PostedRecv, timeout: float) -> bool:
        """A large receive with more posted behind it (a pipelined collective's segments)
        waits for the reader thread to land it (``poke`` sets it to work) instead of
        reading on the caller's thread: the thread streams frame after frame with no gap
        between them, and the hand-off is nothing next to the transfer; so does a lone
        receive of ``LONE_READER_RECV_BYTES`` or more. A smaller lone one is read by its
        caller: waking a parked reader thread first costs one more wake-up
        (docs/backends/tcp.md has the measurements)."""
        event = req.event
        if event is None:
            event = req.event = threading.Event()  # before ``completed`` is looked at
        if req.completed:
            return True
        self.poke(req)
        return event.wait(timeout) or req.completed


class SharedMemoryProgress:
    """Some peers on this host over shared memory: every wait drives the rings (nothing
    else reads them) and sleeps on the doorbell, which a landed socket frame rings."""

    def __init__(self, p2p: ShmP2P) -> None:
        self._p2p = p2p
        self._bell = p2p.bell

    def wait(self, req: PostedRecv, timeout: float) -> bool:
        return self._p2p.wait_until(req.is_done, timeout, None, self._p2p.spin_for(req.view.nbytes))

    def poke(self, req: PostedRecv) -> None:
        self._p2p.progress()

    def wait_event(self, done: threading.Event, timeout: float) -> bool:
        return self._p2p.wait_until(done.is_set, timeout)

    def wake(self) -> None:
        self._bell.ring()


__all__ = ["LONE_READER_RECV_BYTES", "READER_RECV_BYTES", "SharedMemoryProgress", "SocketProgress"]
