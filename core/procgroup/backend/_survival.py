"""What lets survivors go on after a rank dies: the dead set, revoke, and the agreement.

Written once here for every backend. A backend provides a control plane (a small
message to a live peer that still goes out after the channel failed:
``DataChannel.do_control_send``, and ``DataChannel.control_received`` for arrivals)
and reports deaths (``DataChannel.peer_died``). Nothing here uses the job's Store:
rank 0 (its host) may be the rank that died.

The agreement (``agree``) is a coordinator protocol with take-over. The coordinator is
the lowest rank a member believes alive. Members send it their contribution (flag and
the deaths they know of); it decides (AND of the flags, union of the deaths, plus an
``extra`` payload such as the address of a new Store) and tells every live member. If
it dies, the next lowest takes over: it first asks every live member, and adopts a
decision any of them already holds, so no two survivors ever decide differently. Rules
that keep it so: a decision is accepted only from a rank not known dead; a member
answers a new coordinator's question only once it too believes every lower rank dead
(so the old coordinator's late decision is refused); a member that has decided answers
every later question with its decision, even after it returned. A member still waiting
sends its contribution again every second (the same contribution, taken as such), and a
coordinator that took over asks again whoever has not answered.

Contributions and decisions also carry the *suspected* ranks: those counted dead only
because they went silent (``DataChannel.peer_suspected``), which may be alive behind a
cut link. shrink reads ``Decision.suspected`` to refuse going on without a majority.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CommTimeoutError, GroupRevokedError, PeerError

if TYPE_CHECKING:
    from ._channel import DataChannel

log = logging.getLogger(__name__)

#: The largest control message a member accepts (a decision names every dead rank).
MAX_CONTROL_BYTES = 64 * 1024
#: Calls whose records are kept, to answer a member still finishing one of them.
_KEEP = 16
#: A member waiting for a decision sends its contribution again after this many seconds
#: (the coordinator takes a repeated one as the same), and a coordinator that took over
#: asks again whoever has not answered.
_RESEND_S = 1.0


@dataclass(frozen=True)
class Decision:
    """What an agreement decided, the same on every survivor."""

    value: bool
    dead: frozenset[int]
    extra: bytes = b""
    #: the dead that were only suspected (silent past a heartbeat deadline, maybe alive
    #: behind a cut link): a shrink that drops one of them needs a quorum
    suspected: frozenset[int] = frozenset()


class Survival:
    """One channel's fault-tolerance state; the channel creates it on first use."""

    def __init__(self, channel: DataChannel) -> None:
        self.ch = channel
        self.rank = channel.rank
        self.size = channel.size
        self.gid = channel.control_id
        self.cond = threading.Condition()
        self.dead: set[int] = set()
        #: ranks counted dead because they went silent, not because a connection closed
        self.suspected: set[int] = set()
        self._their_suspects: dict[int, set[int]] = {}
        self.revoked = False
        self._instance = 0
        self._decided: dict[int, Decision] = {}
        self._mine: dict[int, bool] = {}
        self._contribs: dict[int, dict[int, tuple[bool, frozenset[int]]]] = {}
        self._following: dict[int, int] = {}
        self._queried: set[int] = set()
        self._asked_at: dict[int, float] = {}
        self._announced: set[int] = set()
        self._outbox: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        self._drained = threading.Condition()
        self._unsent = 0

    # ------------------------------------------------------------ messages
    def _post(self, dst: int, **msg: Any) -> None:
        """Queue a control message; one thread sends them in order (a reader thread
        must never block on a socket)."""
        msg["g"] = self.gid
        log.debug("control -> %d: %s", dst, msg)
        with self._drained:
            self._unsent += 1
        self._outbox.put((dst, json.dumps(msg, separators=(",", ":")).encode()))
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                            name=f"procgroup-control-g{self.gid}")
            self._sender.start()

    def _send_loop(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            dst, body = item
            try:
                self.ch.do_control_send(dst, body)
            except Exception as exc:  # noqa: BLE001 - a dead peer is reported by its reader
                log.debug("control message to rank %d not sent: %s", dst, exc)
            with self._drained:
                self._unsent -= 1
                if not self._unsent:
                    self._drained.notify_all()

    def drain(self, timeout: float) -> None:
        """Wait until every queued control message is out (a decision this rank owes
        the others must leave before the caller may exit or close the channel)."""
        with self._drained:
            self._drained.wait_for(lambda: not self._unsent, timeout)

    def stop(self) -> None:
        if self._sender is not None:
            self.drain(1.0)
            self._outbox.put(None)

    def _live_others(self) -> list[int]:
        return [r for r in range(self.size) if r != self.rank and r not in self.dead]

    def _coordinator(self) -> int:
        return min(r for r in range(self.size) if r not in self.dead or r == self.rank)

    def received(self, src: int, msg: dict[str, Any]) -> None:
        """A control message from ``src`` (a reader thread); malformed ones are dropped."""
        kind = msg.get("t")
        log.debug("control <- %d: %s (dead: %s)", src, msg, sorted(self.dead))
        with self.cond:
            if src in self.dead or not 0 <= src < self.size:
                return
            if kind == "revoke":
                pass
            elif kind in ("contrib", "query", "decide"):
                i = msg.get("i")
                if not isinstance(i, int) or i < 1:
                    return
                if kind == "contrib":
                    flag, dead = msg.get("f"), self._ranks(msg.get("d"))
                    suspects = self._ranks(msg.get("s", []))
                    if not isinstance(flag, bool) or dead is None or suspects is None:
                        return
                    self._contribs.setdefault(i, {})[src] = (flag, dead)
                    self._their_suspects.setdefault(i, set()).update(suspects)
                    if i in self._decided:
                        self._post_decision(src, i)
                elif kind == "query":
                    if i in self._decided:
                        self._post_decision(src, i)
                    elif i in self._mine and self._coordinator() == src:
                        self._following[i] = src
                        self._post_contrib(src, i)
                else:
                    value, dead, extra = msg.get("v"), self._ranks(msg.get("d")), msg.get("x", "")
                    suspects = self._ranks(msg.get("s", []))
                    if not isinstance(value, bool) or dead is None or not isinstance(extra, str) or suspects is None:
                        return
                    try:
                        raw = bytes.fromhex(extra)
                    except ValueError:
                        return
                    self._decided.setdefault(i, Decision(value, dead, raw, suspects & dead))
                self.cond.notify_all()
                return
            else:
                return
        self.revoke(by=src)

    def _ranks(self, value: Any) -> frozenset[int] | None:
        if not isinstance(value, list) or len(value) > self.size:
            return None
        if not all(isinstance(r, int) and 0 <= r < self.size for r in value):
            return None
        return frozenset(value)

    def _post_decision(self, dst: int, i: int) -> None:
        d = self._decided[i]
        if d.suspected:
            self._post(dst, t="decide", i=i, v=d.value, d=sorted(d.dead), x=d.extra.hex(), s=sorted(d.suspected))
        else:
            self._post(dst, t="decide", i=i, v=d.value, d=sorted(d.dead), x=d.extra.hex())

    def _post_contrib(self, dst: int, i: int) -> None:
        """Under the lock: this member's contribution to call ``i`` (its suspicions only
        when it has some: the common message stays as small as before)."""
        if self.suspected:
            self._post(dst, t="contrib", i=i, f=self._mine[i], d=sorted(self.dead), s=sorted(self.suspected))
        else:
            self._post(dst, t="contrib", i=i, f=self._mine[i], d=sorted(self.dead))

    # ------------------------------------------------------------ deaths and revoke
    def died(self, rank: int) -> bool:
        """Record a death; True the first time."""
        with self.cond:
            if rank in self.dead or rank == self.rank or not 0 <= rank < self.size:
                return False
            self.dead.add(rank)
            self.cond.notify_all()
        return True

    def suspect(self, rank: int) -> None:
        """``rank`` went silent past a heartbeat deadline: its death, reported next, may be
        a cut link rather than an exit."""
        with self.cond:
            if 0 <= rank < self.size and rank != self.rank:
                self.suspected.add(rank)

    def revoke(self, by: int | None = None) -> None:
        """Fail every pending and later op here, and tell every live member (once)."""
        with self.cond:
            if self.revoked:
                return
            self.revoked = True
            dead = sorted(self.dead)
            others = self._live_others()
        who = "this rank" if by is None else f"rank {by}"
        self.ch.interrupt(GroupRevokedError(f"the group was revoked by {who}; shrink() it to go on",
                                            ranks=dead))
        for r in others:
            if r != by:
                self._post(r, t="revoke")

    # ------------------------------------------------------------ the agreement
    def agree(self, flag: bool, timeout: float, extra: Callable[[], bytes] | None = None) -> Decision:
        """Collective over the live members: the same Decision on every survivor."""
        deadline = time.monotonic() + timeout
        with self.cond:
            self._instance += 1
            i = self._instance
            self._mine[i] = bool(flag)
            sent_at = 0.0
            while i not in self._decided:
                coord = self._coordinator()
                now = time.monotonic()
                if coord == self.rank:
                    self._coordinate(i, extra)
                elif self._following.get(i) != coord or now - sent_at > _RESEND_S:
                    # sent again after a while: a message to a group's member that has
                    # not created the group yet is kept for it, but never lost silently
                    self._following[i] = coord
                    sent_at = now
                    self._post_contrib(coord, i)
                if i in self._decided:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._timed_out(i, timeout)
                self.cond.wait(min(left, 0.5))
            decision = self._decided[i]
            if self._coordinator() == self.rank and i not in self._announced:
                self._announced.add(i)  # adopted from a member: the others wait on this rank
                for r in self._live_others():
                    self._post_decision(r, i)
            if self.rank in decision.dead:
                raise PeerError(f"agree: the other survivors counted this rank (rank {self.rank}) as dead",
                                rank=self.rank, ranks=sorted(decision.dead))
            new = decision.dead - self.dead
            self.dead |= decision.dead
            self._forget(i - _KEEP)
        for r in sorted(new):
            self.ch.peer_died(r, PeerError(f"rank {r} was counted dead by the survivors' agreement", rank=r))
        self.drain(max(deadline - time.monotonic(), 1.0))
        return decision

    def _forget(self, below: int) -> None:
        """Drop the records of old calls (a loop that agrees each step must not grow). A
        live member is never more than one call behind: a call cannot finish without it."""
        for table in (self._decided, self._mine, self._contribs, self._following, self._their_suspects):
            for old in [k for k in table if k < below]:
                del table[old]
        self._queried = {k for k in self._queried if k >= below}
        self._asked_at = {k: v for k, v in self._asked_at.items() if k >= below}
        self._announced = {k for k in self._announced if k >= below}

    def _coordinate(self, i: int, extra: Callable[[], bytes] | None) -> None:
        """Under the lock: ask once, then decide once every live member has answered."""
        others = self._live_others()
        got = self._contribs.get(i, {})
        now = time.monotonic()
        if self.rank != 0 and i in self._queried and now - self._asked_at.get(i, now) > _RESEND_S:
            self._queried.discard(i)  # ask again whoever has not answered
            others_to_ask = [r for r in others if r not in got]
        else:
            others_to_ask = others
        if i not in self._queried:
            self._queried.add(i)
            self._asked_at[i] = now
            # a coordinator that took over asks first (an earlier one may have decided);
            # rank 0 never takes over from anyone, and every member sends it its
            # contribution unasked, so it skips the question (half the messages)
            if self.rank != 0:
                for r in others_to_ask:
                    self._post(r, t="query", i=i)
        if any(r not in got for r in others):
            return
        value = self._mine[i] and all(got[r][0] for r in others)
        dead = set(self.dead)
        for r in others:
            dead |= got[r][1]
        raw = extra() if extra is not None else b""
        final = frozenset(dead - {self.rank})
        suspects = (set(self.suspected) | self._their_suspects.get(i, set())) & final
        self._decided[i] = Decision(value, final, raw, frozenset(suspects))
        self._announced.add(i)
        for r in others:
            self._post_decision(r, i)

    def _timed_out(self, i: int, timeout: float) -> CommTimeoutError:
        coord = self._coordinator()
        if coord == self.rank:
            got = self._contribs.get(i, {})
            missing = [r for r in self._live_others() if r not in got]
            return CommTimeoutError(f"agree: ranks {missing} did not answer within {timeout:g}s",
                                    op="agree", ranks=missing)
        return CommTimeoutError(f"agree: no decision from the coordinator (rank {coord}) within {timeout:g}s",
                                op="agree", ranks=[coord])


def parse(payload: bytes) -> dict[str, Any] | None:
    """A control message, or None when it is not one (never trust a peer's bytes)."""
    if len(payload) > MAX_CONTROL_BYTES:
        return None
    try:
        msg = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("g"), int) else None


__all__ = ["MAX_CONTROL_BYTES", "Decision", "Survival", "parse"]
