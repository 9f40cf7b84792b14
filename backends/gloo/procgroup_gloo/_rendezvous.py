"""Building a gloo context: the key exchange of ``connectFullMesh`` over the side channel.

gloo's ``connectFullMesh`` asks a Store for the peers' addresses through pygloo's
``rendezvous.CustomStore`` (a Python object with set/get/wait/del_keys). pygloo does
not release the GIL while gloo blocks (connecting pairs, and every collective), so a
process inside gloo runs no other Python thread. With ``ctx.store`` behind that adapter,
a TCPStore served by a thread of world rank 0 stops answering as soon as rank 0 blocks
in a pair connect, and the ranks still fetching keys hang (seen with 2 ranks). So the
keys travel over the channel's TCP side channel instead, which was itself set up through
``ctx.store`` (every init method works): each ``set`` is sent to every member, each
``get``/``wait`` reads messages until the key has arrived. Nothing here is served by
another process's Python, so a peer blocked in gloo never stalls the exchange.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from procgroup.backend import ChannelContext, DataChannel
from procgroup.errors import CommTimeoutError, ProcGroupError, RendezvousError

log = logging.getLogger(__name__)


class MeshStore:
    """The key-value calls gloo makes during connectFullMesh, served over ``p2p``."""

    def __init__(self, p2p: DataChannel, ctx: ChannelContext, tag: int) -> None:
        self._p2p = p2p
        self._ctx = ctx
        self._tag = tag
        self._deadline = time.monotonic() + ctx.timeout
        self._keys: dict[str, bytes] = {}
        self._sets = 0
        self._received = 0

    # -- called by gloo (C++) through pygloo.rendezvous.CustomStore ---------------
    def set(self, key: str, value: bytes) -> None:
        data = bytes(value)
        self._keys[key] = data
        self._sets += 1
        raw = np.frombuffer(key.encode() + data, dtype=np.uint8)
        header = np.array([len(key.encode()), len(data)], dtype=np.int64)
        for peer in range(self._ctx.size):
            if peer != self._ctx.rank:
                self._p2p.send(header, peer, self._tag)
                self._p2p.send(raw, peer, self._tag)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self._keys[key]

    def wait(self, keys: Sequence[str], *_: Any) -> None:
        while any(k not in self._keys for k in keys):
            self._receive_one([k for k in keys if k not in self._keys])

    def del_keys(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._keys.pop(key, None)

    # -- ours ---------------------------------------------------------------------
    def _receive_one(self, waiting_for: Sequence[str]) -> None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise CommTimeoutError(
                f"gloo rendezvous: keys {list(waiting_for)} did not arrive within {self._ctx.timeout}s",
                op="init",
            )
        header = np.zeros(2, dtype=np.int64)
        work = self._p2p.irecv(header, None, self._tag)
        work.wait(timeout=remaining)
        src = int(work.result())
        raw = np.zeros(int(header[0] + header[1]), dtype=np.uint8)
        self._p2p.recv(raw, src, self._tag)
        blob = raw.tobytes()
        self._keys[blob[: header[0]].decode()] = blob[header[0]:]
        self._received += 1

    def drain(self) -> None:
        """Read the keys gloo never asked for, so none stays queued on the side channel.

        gloo's protocol is symmetric: every member calls ``set`` the same number of times.
        """
        expected = self._sets * (self._ctx.size - 1)
        try:
            while self._received < expected:
                self._receive_one(["(unread keys)"])
        except ProcGroupError as exc:  # best effort: only a leak if it fails
            log.debug("gloo rendezvous: %d of %d key messages unread: %s", expected - self._received, expected, exc)


def connect_context(ctx: ChannelContext, p2p: DataChannel, device: Any, tag: int) -> Any:
    """A gloo context of ``ctx.size`` ranks, full mesh on ``device``; keys over ``p2p``."""
    import pygloo

    store = MeshStore(p2p, ctx, tag)
    context = pygloo.rendezvous.Context(ctx.rank, ctx.size)
    try:
        context.connectFullMesh(pygloo.rendezvous.CustomStore(store), device)
    except ProcGroupError:
        raise
    except RuntimeError as exc:
        raise RendezvousError(f"gloo: connecting the full mesh of {ctx.size} ranks failed: {exc}") from exc
    store.drain()
    return context


def create_device(address: str) -> Any:
    """A gloo tcp device bound to ``address`` (see procgroup.backend.host_address)."""
    import pygloo

    if not pygloo.transport_tcp_available():
        raise RendezvousError("gloo: this pygloo build has no tcp transport")
    return pygloo.transport.tcp.CreateDevice(pygloo.transport.tcp.attr(address))


__all__ = ["MeshStore", "connect_context", "create_device"]
