"""Choosing a free master port without a bind race.

Why not "bind port 0, read the number, close, pass it on": between the close and rank 0's
TCPStore binding it, any other process may take the port. Instead the launcher *keeps* a
socket bound to the port (with SO_REUSEADDR, never listening) for the whole job:

- the kernel never hands a port that is bound to another ``bind(port 0)`` caller, and a
  plain ``bind`` without SO_REUSEADDR to it fails, so nobody else can take it;
- on Linux a second socket with SO_REUSEADDR may bind the same port as long as no socket
  on it is *listening*, so rank 0's TCPStore (which sets SO_REUSEADDR, as servers do)
  binds and listens on it; the launcher's socket never accepts, so connections go to the
  store;
- after a restart (``--max-restarts``) the same port is still held and rebindable despite
  connections in TIME_WAIT.
"""

from __future__ import annotations

import logging
import socket

logger = logging.getLogger(__name__)


class PortReservation:
    """A bound, non-listening SO_REUSEADDR socket that holds a free TCP port."""

    def __init__(self, host: str = "") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.port: int = self._sock.getsockname()[1]
        logger.debug("reserved master port %d", self.port)

    def close(self) -> None:
        """Release the port (at the end of the job)."""
        self._sock.close()
