"""Heartbeats: a rank that stops (SIGSTOP, a hung host) counts as dead after a deadline.

A process that exits is seen at once (its sockets close); a frozen one keeps its
sockets open and says nothing, and so does a host whose link went down (its processes
alive, unreachable). One thread per channel sends a header-only frame to every peer
each ``deadline / 5`` (at most each second) and watches when each peer was last heard
from (any frame counts, data or heartbeat; a payload still arriving counts as heard),
waking when the quietest peer's deadline falls due. A peer silent for longer than the
deadline is reported dead, and as *suspected* first (the channel's
``DataChannel.peer_suspected``), since it may be alive behind a cut link: a shrink that
drops it then needs a majority (docs/fault-tolerance.md, "Cut links").

Why a thread and never the op path: a rank that is only slow (a long computation
between two ops) still sends its heartbeats, so it never counts as dead. The thread
never blocks on a socket (a heartbeat goes out only when the socket takes it at once),
and after a pause of its own (this process was stopped, or starved of CPU) it judges
nobody until it has been awake for a full deadline.

Setting: ``PROCGROUP_HEARTBEAT_TIMEOUT`` (seconds; 0 or "off" turns it off), or the
channel option ``heartbeat_timeout``. Default 10 s: far above the scheduling stalls of
an oversubscribed host or a long garbage collection (well under a second), short
enough that a hung rank costs a training job seconds, not the 300 s op timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from procgroup.backend import setting, timeout_seconds

from ._conn import Peer

log = logging.getLogger(__name__)

ENV_HEARTBEAT = "PROCGROUP_HEARTBEAT_TIMEOUT"
DEFAULT_DEADLINE_S = 10.0
#: Woken this long after a peer's deadline falls due (its last frame may land meanwhile).
_SLACK_S = 0.005
#: The thread never wakes more often than this (a peer heard a moment ago sets no alarm
#: sooner than its own deadline anyway; this bounds a busy clock's cost).
_MIN_SLEEP_S = 0.01


def deadline_seconds(options: Mapping[str, Any] | None) -> float:
    """The heartbeat deadline in seconds (0: heartbeats off)."""
    value, source = setting("heartbeat_timeout", ENV_HEARTBEAT, str(DEFAULT_DEADLINE_S), options)
    if value in ("0", "0.0", "off", "false", "no"):
        return 0.0
    return timeout_seconds(value, source=source)


class Heartbeat:
    """Sends heartbeats to ``peers()`` and reports those silent past ``deadline``."""

    def __init__(self, peers: Callable[[], Iterable[Peer]], deadline: float,
                 on_silent: Callable[[Peer, float], None], name: str) -> None:
        self.deadline = deadline
        self.interval = min(deadline / 5, 1.0)
        self._peers = peers
        self._on_silent = on_silent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        """Send every ``interval``; between sends, wake when the quietest peer's deadline
        falls due, so a silent peer is reported within a few ms of its deadline, not up to
        one interval later (cut links: detection within the deadline + 100 ms)."""
        now = time.monotonic()
        judge_from = now + self.deadline / 2
        next_send = now
        wake = now
        while True:
            delay = max(wake - time.monotonic(), 0.0)
            if self._stop.wait(delay):
                return
            now = time.monotonic()
            if now - wake > self.deadline / 2:  # this process was paused: others are not to blame
                judge_from = now + self.deadline
            peers = list(self._peers())
            if now >= next_send:
                next_send = now + self.interval
                for peer in peers:
                    peer.send_heartbeat()
            due = next_send
            for peer in peers:
                if peer.reader.receiving:
                    continue
                expires = peer.reader.last_heard + self.deadline
                if now >= judge_from and now > expires:
                    self._report(peer, now - peer.reader.last_heard)
                    continue
                due = min(due, max(expires, judge_from) + _SLACK_S)
            wake = max(due, now + _MIN_SLEEP_S)

    def _report(self, peer: Peer, silent: float) -> None:
        """A silence is a suspicion before it is a death: the peer may be alive behind a
        cut link, so its channel hears so first (a shrink that drops it needs a majority)."""
        try:
            suspect = getattr(peer.events, "peer_suspected", None)
            if suspect is not None:
                suspect(peer.rank)
            self._on_silent(peer, silent)
        except Exception:
            log.warning("reporting a silent peer failed", exc_info=True)


__all__ = ["DEFAULT_DEADLINE_S", "ENV_HEARTBEAT", "Heartbeat", "deadline_seconds"]
