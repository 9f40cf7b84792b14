"""ControlPlane: a channel's fault-tolerance component, beside its data path.

Every DataChannel owns one (``channel.control``) and delegates to it: the dead and
suspected ranks, revoke, the survivors' agreement (:mod:`._survival`), uniform failure
(:mod:`._uniform`), the departure reason a leaving rank sends, and the routing of
control messages to the channels that ride on this one (sub-groups, gloo and nccl over
their side channel). The backend's part stays three hooks on the channel
(``do_control_send``, ``control_received``, ``peer_died``; docs/plugins.md), so a
plugin written against the DataChannel contract keeps working unchanged.

Routing rules, and why:

- A channel carried by another (``carry_control``) is registered at every ancestor
  with the ancestor's rank map composed, so the channel whose transport delivered a
  message hands it straight to its target however deeply nested (gloo's sub-group
  rides on a tcp sub-group that rides on the world's side channel).
- A message for a control id not registered yet is kept (bounded) and delivered when
  its channel registers: members create a group without a barrier, so a fast member's
  first agreement message may reach a slow member before its ``new_group`` returned.
  Dropping it would leave the coordinator waiting until the timeout.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import PeerError
from . import _recorder, _uniform
from ._survival import Decision, Survival, parse

if TYPE_CHECKING:
    from ._channel import DataChannel

log = logging.getLogger(__name__)

#: Messages kept for control ids not registered yet, at most (oldest dropped first);
#: a group's first agreement needs one per member, a revoke one.
MAX_EARLY_MESSAGES = 1024
#: ... and their bytes at most.
MAX_EARLY_BYTES = 4 * 1024 * 1024

Route = tuple["DataChannel", dict[int, int]]


class ControlPlane:
    """One channel's control plane. Created with the channel; cheap until used."""

    def __init__(self, channel: DataChannel) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._survival: Survival | None = None
        #: channels carried directly by this one (deaths and suspicions go down these)
        self.children: dict[int, Route] = {}
        #: every channel carried by this one or below it, with this channel's rank -> theirs
        self._routes: dict[int, Route] = {}
        #: the channel carrying this one, and its rank -> this channel's
        self._carrier: Route | None = None
        self._early: collections.OrderedDict[int, list[tuple[int, bytes]]] = collections.OrderedDict()
        self._early_count = 0
        self._early_bytes = 0

    # ------------------------------------------------------------ the agreement's state
    @property
    def survival(self) -> Survival:
        """The dead set, revoke and the agreement (created on first use)."""
        with self._lock:
            if self._survival is None:
                self._survival = Survival(self.channel)
            return self._survival

    @property
    def started(self) -> Survival | None:
        """The survival state if it exists already (no side effect)."""
        return self._survival

    def failed_ranks(self) -> tuple[int, ...]:
        """The channel ranks known dead (from the agreement's state, else the failure)."""
        if self._survival is not None:
            return tuple(sorted(self._survival.dead))
        failure = self.channel.failure
        return tuple(getattr(failure, "ranks", ()) or ()) if failure is not None else ()

    def revoke(self) -> None:
        self.survival.revoke()

    def agree(self, flag: bool, timeout: float, extra: Callable[[], bytes] | None = None) -> Decision:
        return self.survival.agree(flag, timeout, extra)

    def run_uniform(self, op: str, args: tuple[Any, ...]) -> None:
        _uniform.run(self.channel, op, args)

    # ------------------------------------------------------------ deaths
    def died(self, rank: int, exc: BaseException | None) -> bool:
        """``rank`` is dead: tell the carried channels holding it, record it, then fail what
        involves it here (``DataChannel.fail_peer``). The carried channels first, and by
        every thread that reports the death, not only the first: a call of a carried
        channel may wake as soon as any reporter returns (another thread saw the same
        closed socket), and must then find the death in that channel's failed_ranks."""
        ch = self.channel
        for child, index in list(self.children.values()):
            if rank in index:
                child.peer_died(index[rank], exc if exc is not None else ch.failure)
        if ch.survives and not self.survival.died(rank):
            return False
        failure = ch.failure
        if isinstance(failure, PeerError) and self._survival is not None:  # world ranks, as .rank
            failure.ranks = tuple(ch.ctx.global_rank(r) for r in sorted(self._survival.dead))
        if exc is not None:
            ch.fail_peer(rank, exc)
        return True

    def suspect(self, rank: int) -> None:
        """``rank`` went silent (a heartbeat deadline): it will be reported dead, but it may
        be alive behind a cut link. Called before the death is reported."""
        if self.channel.survives:
            self.survival.suspect(rank)
        for child, index in list(self.children.values()):
            if rank in index:
                child.control.suspect(index[rank])

    # ------------------------------------------------------------ routing
    def carry(self, child: DataChannel, index: dict[int, int]) -> None:
        """Route ``child``'s control messages and deaths through this channel (``index``:
        this channel's rank -> the child's)."""
        cid = child.control_id
        with self._lock:
            self.children[cid] = (child, index)
        child.control._carrier = (self.channel, index)
        self._register(cid, child, index)

    def _register(self, cid: int, target: DataChannel, index: dict[int, int]) -> None:
        """Register ``target`` here and at every ancestor; deliver what waited for it."""
        with self._lock:
            self._routes[cid] = (target, index)
            waiting = self._early.pop(cid, [])
            for _src, body in waiting:
                self._early_count -= 1
                self._early_bytes -= len(body)
            carrier = self._carrier
        for src, body in waiting:
            self._deliver(target, index, src, body)
        if carrier is not None:
            parent, to_me = carrier
            parent.control._register(cid, target, {p: index[c] for p, c in to_me.items() if c in index})

    def release(self, child: DataChannel) -> None:
        """Stop routing to ``child`` (it closed)."""
        cid = child.control_id
        with self._lock:
            found = self.children.get(cid)
            if found is not None and found[0] is child:
                del self.children[cid]
        self._unregister(cid, child)

    def _unregister(self, cid: int, target: DataChannel) -> None:
        with self._lock:
            found = self._routes.get(cid)
            if found is None or found[0] is not target:
                return
            del self._routes[cid]
            carrier = self._carrier
        if carrier is not None:
            carrier[0].control._unregister(cid, target)

    def close(self) -> None:
        """The channel closes: its carrier stops routing to it; what this rank owes the
        others goes out first."""
        if self._survival is not None:
            self._survival.stop()
        carrier = self._carrier
        if carrier is not None:
            carrier[0].control.release(self.channel)

    def received(self, src: int, payload: bytes) -> None:
        """A control message from channel rank ``src`` (any thread); PeerError when it is
        malformed (the backend then closes that connection)."""
        ch = self.channel
        msg = parse(payload)
        if msg is None:
            who = ch.ctx.global_rank(src)
            raise PeerError(f"rank {who} sent a malformed control message: the stream is corrupt or not "
                            f"procgroup's; closing the connection to it", rank=who)
        left = msg.get("left")
        if isinstance(left, str):  # a member says why it leaves (say_why_leaving)
            _recorder.departed(ch.ctx.global_rank(src), left)
            return
        gid = msg["g"]
        if gid == ch.control_id:
            self.survival.received(src, msg)
            return
        with self._lock:
            found = self._routes.get(gid)
            if found is None:
                self._keep(gid, src, payload)
                return
        self._deliver(found[0], found[1], src, payload)

    @staticmethod
    def _deliver(target: DataChannel, index: dict[int, int], src: int, payload: bytes) -> None:
        if src in index:  # a non-member's message for a group is dropped
            target.control_received(index[src], payload)

    def _keep(self, gid: int, src: int, payload: bytes) -> None:
        """Under the lock: keep a message for a channel not registered yet (bounded)."""
        self._early.setdefault(gid, []).append((src, payload))
        self._early.move_to_end(gid)
        self._early_count += 1
        self._early_bytes += len(payload)
        while self._early_count > MAX_EARLY_MESSAGES or self._early_bytes > MAX_EARLY_BYTES:
            old_gid, kept = next(iter(self._early.items()))
            _src, body = kept.pop(0)
            self._early_count -= 1
            self._early_bytes -= len(body)
            if not kept:
                del self._early[old_gid]
            log.warning("control message for unknown group %d dropped: too many waiting", old_gid)

    # ------------------------------------------------------------ leaving
    def say_why_leaving(self) -> None:
        """A rank that leaves because something failed tells each live member why, before
        its goodbye: an error its departure causes there then names the first failure,
        not this departure (procgroup.backend._recorder). The world's root channel only."""
        ch = self.channel
        if not ch.survives or ch.size < 2 or self._carrier is not None or ch.ctx.group_id != 0:
            return
        reason = _recorder.departure_reason(ch)
        if reason is None:
            return
        payload = json.dumps({"g": ch.control_id, "left": reason[:2000]}).encode()
        dead = set(self.failed_ranks())
        for peer in range(ch.size):
            if peer == ch.rank or peer in dead:
                continue
            try:
                ch.do_control_send(peer, payload)
            except Exception:  # best effort: a peer already gone needs no reason
                log.debug("could not tell rank %d why this rank leaves", peer, exc_info=True)


__all__ = ["MAX_EARLY_BYTES", "MAX_EARLY_MESSAGES", "ControlPlane"]
