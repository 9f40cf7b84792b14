"""A peer connection's life: one state, moved on only along the legal transitions.

::

    OPEN ──close()──> CLOSING ──EOF / read ends──> CLOSED
      │                  │
      │                  └──goodbye read──> LEFT
      ├──goodbye read──> LEFT
      └──EOF without goodbye, a broken stream──> BROKEN

``OPEN``: frames flow both ways. ``CLOSING``: this rank closes (its goodbye is out);
its reader reads on until the stream ends. ``LEFT``: the peer said goodbye
(destroy_process_group); what it sent before is delivered. ``BROKEN``: the stream
ended without a goodbye (the peer died, or broke the protocol): the channel breaks.
``CLOSED``: this rank closed and reading has ended. The last three are *over*:
nothing more is read. A transition not in the table is refused (``Peer.become``
returns False): the first end wins, so a goodbye and a local close racing each other
settle on one state.
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "PeerState"]


class PeerState(enum.Enum):
    """One state of a peer connection; ``over``, ``left`` and ``closing`` are what the
    readers and the channel ask of it (plain attributes: they are read on every frame)."""

    OPEN = ("open", False, False, False)
    CLOSING = ("closing", False, False, True)
    LEFT = ("left", True, True, False)
    BROKEN = ("broken", True, False, False)
    CLOSED = ("closed", True, False, True)

    def __init__(self, label: str, over: bool, left: bool, closing: bool) -> None:
        self.label = label
        #: nothing more will be read from the peer
        self.over = over
        #: the peer said goodbye
        self.left = left
        #: this rank is closing the connection
        self.closing = closing


#: state -> the states it may move to
TRANSITIONS: dict[PeerState, frozenset[PeerState]] = {
    PeerState.OPEN: frozenset({PeerState.CLOSING, PeerState.LEFT, PeerState.BROKEN}),
    PeerState.CLOSING: frozenset({PeerState.CLOSED, PeerState.LEFT}),
    PeerState.LEFT: frozenset(),
    PeerState.BROKEN: frozenset(),
    PeerState.CLOSED: frozenset(),
}
