"""Fingerprinted collectives over the sockets: every frame says which op sent it.

A collective run over point-to-point (the base's algorithms, the pipelined ring) is
started by its dispatcher (``_dispatch``) as a :class:`Collective`: the tag it draws and
its fingerprint, registered under that tag in the :class:`Ledger` its channel shares
with the root TcpChannel, and handed to the algorithm as a value. Sends of that tag carry the fingerprint in the frame
header; the receiving channel compares it with its own for the tag (when the frame
arrives, or when a receive takes it off the unexpected queue), so ranks that
disagree get a MismatchError, never wrong data. A 0-byte collective, which the
algorithms would skip, runs a barrier under its fingerprint instead, so a 0-byte vs
non-0 disagreement is found too.

A rank whose part of a collective only sends returns before a disagreeing frame or a
peer's mismatch notice can reach it. The :class:`Ledger` (one per transport) keeps the
recently finished collectives, so a frame or notice for one of them is still a
mismatch: it is raised at the end of this rank's next collective on that group, whose
own result is complete by then (so the ranks stay in step).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procgroup.backend import Fingerprint
from procgroup.errors import MismatchError
from procgroup.ops import ReduceOp

__all__ = ["DONE_TAGS", "NO_ROOT", "Collective", "Fingerprints", "Ledger"]

NO_ROOT = -1  # procgroup.backend.Fingerprint's "no root"
#: how many finished collectives a transport remembers (a frame for one of them is a mismatch)
DONE_TAGS = 256


def _no_check(tag: int, fp: bytes) -> BaseException | None:
    return None


class Ledger:
    """The collectives of one transport (its root channel and every sub-channel).

    ``active``: tag -> fingerprint of each running collective (what the receive path
    compares). ``done``: tag -> (fingerprint, group id) of the last ``DONE_TAGS`` that
    finished without error. A mismatch of a finished collective waits in ``late`` (per
    group) until the group's next collective ends; each is raised once (``_reported``).
    ``check_end(tag, fp)``, set by the root channel, runs as a collective ends: frames
    still queued under its tag, and the error of a tag found mismatched meanwhile.
    """

    def __init__(self) -> None:
        self.active: dict[int, bytes] = {}
        self.done: dict[int, tuple[bytes, int]] = {}
        self._order: deque[int] = deque()  # ``done``'s tags, oldest first
        self.check_end: Callable[[int, bytes], BaseException | None] = _no_check
        self._late: dict[int, tuple[int, BaseException, bytes]] = {}
        self._reported: set[int] = set()
        self._lock = threading.Lock()

    def finished(self, tag: int, fp: bytes, group_id: int) -> BaseException | None:
        """The collective of ``tag`` ended well here: the error it must raise after all, if any."""
        # single dict and deque operations: collectives of several groups may end at once
        self.done[tag] = (fp, group_id)  # recorded before it leaves ``active``: a frame sees one of them
        order = self._order
        order.append(tag)
        if len(order) > DONE_TAGS:
            try:
                old = order.popleft()
            except IndexError:
                pass
            else:
                self.done.pop(old, None)
                self._reported.discard(old)
        self.active.pop(tag, None)
        own = self.check_end(tag, fp)
        if own is None and not self._late:
            return None
        with self._lock:
            if own is not None and tag not in self._reported:
                self._reported.add(tag)
                return own
            late = self._late.pop(group_id, None)
        if late is None:
            return None
        return late[1] if late[0] == tag else _earlier(late[1], late[2])

    def mark_late(self, tag: int, exc: BaseException) -> None:
        """A mismatch of ``tag`` was found (a frame or a peer's notice): when this rank's part
        already ended, keep it for the group's next collective."""
        with self._lock:
            entry = self.done.get(tag)
            if entry is None or tag in self._reported:
                return
            self._reported.add(tag)
            self._late.setdefault(entry[1], (tag, exc, entry[0]))


def _earlier(exc: BaseException, fp: bytes) -> BaseException:
    """The error a collective raises for an earlier one of its group that disagreed."""
    ranks = getattr(exc, "ranks", ())
    return MismatchError(f"an earlier collective of this group ({Fingerprint.unpack(fp).describe()}) "
                         f"disagreed, found after this rank's part of it had returned: {exc}", ranks=ranks)


@dataclass(frozen=True)
class Collective:
    """One collective over the sockets as its dispatcher starts it: the private ``tag``
    its frames carry and its packed fingerprint ``fp`` (registered under ``tag`` in the
    :class:`Ledger`'s ``active`` table while it runs). Handed to the algorithm as a value."""

    tag: int
    fp: bytes


class Fingerprints:
    """The fingerprints of one channel's collectives: packs each (cached but for its
    sequence number, which counts this channel's collectives)."""

    def __init__(self) -> None:
        self._seq = 0
        self._cache: dict[tuple[Any, ...], bytes] = {}

    def next(self, op: str, array: Any, root: int, reduce_op: ReduceOp | None) -> bytes:
        """The packed fingerprint of this channel's next collective."""
        if array is None:
            key: tuple[Any, ...] = (op, None, 0, root, reduce_op)
        else:
            key = (op, array.dtype, array.nbytes, root, reduce_op)
        packed = self._cache.get(key)
        if packed is None:
            if len(self._cache) >= 1024:
                self._cache.clear()
            packed = self._cache[key] = Fingerprint.of(op, 0, array, root=root, reduce_op=reduce_op).pack()
        seq = self._seq
        self._seq = seq + 1
        return packed[:8] + (seq & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little") + packed[16:]
