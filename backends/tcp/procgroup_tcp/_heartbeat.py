"""Heartbeats: a rank that stops (SIGSTOP, a hung host) counts as dead after a deadline.

A process that exits is seen at once (its sockets close); a frozen one keeps its
sockets open and says nothing. One thread per channel sends a header-only frame to
every peer each ``deadline / 5`` (at most each second) and checks when each peer was
last heard from (any frame counts, data or heartbeat; a payload still arriving counts
as heard). A peer silent for longer than the deadline is reported dead.

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
        last = time.monotonic()
        judge_from = last + self.deadline / 2
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            if now - last > self.deadline / 2:  # this process was paused: others are not to blame
                judge_from = now + self.deadline
            last = now
            for peer in list(self._peers()):
                peer.send_heartbeat()
                if now < judge_from or peer.reader.receiving:
                    continue
                silent = now - peer.reader.last_heard
                if silent > self.deadline:
                    try:
                        self._on_silent(peer, silent)
                    except Exception:
                        log.warning("reporting a silent peer failed", exc_info=True)


__all__ = ["DEFAULT_DEADLINE_S", "ENV_HEARTBEAT", "Heartbeat", "deadline_seconds"]
