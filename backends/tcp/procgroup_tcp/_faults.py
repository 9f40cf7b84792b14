"""tcp's fault handling: ranks that disagree on a collective, and peers that die or leave.

Two mixins of :class:`~procgroup_tcp.channel.TcpChannel` (its :class:`PeerEvents`
side), kept apart from the data path:

* :class:`MismatchHandling`: every data frame is matched here first
  (``match_incoming``): a frame of a running collective whose fingerprint differs from
  this rank's is a mismatch; the rank that sees one first fails the collective's tag
  (``Matcher.poison``) and tells every peer with a mismatch notice. A rank whose part of
  a collective only sends finds a disagreement afterwards: a late frame, a probe from a
  receiver that waits, a notice (``_fingerprints.Ledger`` keeps it for the group's next
  collective).
* :class:`DeathHandling`: a peer lost without a goodbye breaks the channel
  (``DataChannel.fail``): every pending and later call raises a PeerError naming that
  rank, and the other peers are told which rank it was; a goodbye fails only the
  receives that wait on that peer; the heartbeat's silent peer counts as dead.

Both use the channel's fields named in their class bodies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from procgroup.backend import ChannelContext, Fingerprint, mismatch
from procgroup.errors import PeerError

from ._conn import Peer, left_error
from ._fingerprints import Ledger
from ._match import DISCARD, Discard, Matcher, PostedRecv, Unexpected
from ._wire import KIND_MISMATCH, KIND_PEER_LOST, LOST, MAX_LOST_BYTES, NO_FP, NOTICE

if TYPE_CHECKING:
    from ._heartbeat import Heartbeat
    from ._p2p import OutLink, ShmP2P
    from ._shm import SharedMemoryArena

__all__ = ["DeathHandling", "MismatchHandling"]


class MismatchHandling:
    """Fingerprints compared on the receive path; mismatches found, told and remembered."""

    ctx: ChannelContext
    rank: int
    _fps: dict[int, bytes]
    _ledger: Ledger
    _matcher: Matcher
    _peers: dict[int, Peer]

    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes,
                       fp: bytes) -> PostedRecv | Unexpected | Discard:
        """Where a data frame lands (every frame, socket or ring, comes here first): a frame of
        a running collective carrying another fingerprint is a mismatch (dropped), one of a
        collective this rank finished is checked against the ledger; the rest go to the
        matcher (a posted receive, or the unexpected queue)."""
        expected = self._fps.get(tag)
        if expected is not None:
            if fp != expected:
                self._mismatched(tag, expected, fp, src)
                return DISCARD
            return self._matcher.match_incoming(src, tag, nbytes, dtype_char, fp)
        if self._ledger.done and self._late_frame(src, tag, fp):
            return DISCARD
        found = self._matcher.match_incoming(src, tag, nbytes, dtype_char, fp)
        # its collective may have ended between the look-up above and the queueing
        if isinstance(found, Unexpected) and self._ledger.done:
            self._late_frame(src, tag, fp)
        return found

    # ---------------------------------------------------------------- mismatches found late
    # A rank whose part of a collective only sends cannot see a disagreement before it
    # returns; these find it afterwards (see ``_fingerprints.Ledger``).
    def _late_frame(self, src: int, tag: int, fp: bytes) -> bool:
        """A frame for a collective this rank already finished, of another op: a mismatch."""
        entry = self._ledger.done.get(tag)
        if entry is None or entry[0] == fp or tag in self._matcher.dead:
            return False
        self._ledger.mark_late(tag, self._mismatched(tag, entry[0], fp, src))
        return True

    def _probe(self, req: PostedRecv) -> bool:
        """A receive has waited a while: if it is a collective's, tell its sender the
        fingerprint (False: a user's receive, nothing to compare)."""
        fp = self._fps.get(req.tag)
        peer = self._peers.get(req.src) if req.src is not None else None
        if fp is None or peer is None:
            return False
        peer.send_probe(req.tag, fp)
        return True

    def fingerprint_probe(self, peer: Peer, tag: int, fp: bytes) -> None:
        """``peer`` waits to receive in the collective of ``tag`` under ``fp``: a running or
        finished collective of that tag with another fingerprint is a mismatch (one this
        rank has not reached yet is not: the peer probes again)."""
        expected = self._fps.get(tag)
        if expected is not None:
            if fp != expected:
                self._mismatched(tag, expected, fp, peer.rank)
        elif self._ledger.done:
            self._late_frame(peer.rank, tag, fp)

    def _collective_ended(self, tag: int, fp: bytes) -> BaseException | None:
        """The collective of ``tag`` ended here: a frame of another op still queued under its
        tag is a mismatch, and so is a mismatch found (or told) while it ran."""
        matcher = self._matcher
        ux = matcher.queued(tag)
        if ux is not None and ux.fp != fp:
            self._mismatched(tag, fp, ux.fp, ux)
        return matcher.dead_error(tag) if matcher.dead else None

    def _mismatched(self, tag: int, mine: bytes, theirs: bytes, src: int | Unexpected) -> BaseException:
        """This rank found the collective of ``tag`` disagrees: fail it here, tell every peer."""
        if isinstance(src, Unexpected):
            theirs, src = src.fp, src.src
        me, them = self.ctx.global_rank(self.rank), self.ctx.global_rank(src)
        exc = mismatch(Fingerprint.unpack(mine), Fingerprint.unpack(theirs), me, them)
        if self._matcher.poison(tag, exc):
            notice = memoryview(NOTICE.pack(me, them, mine, theirs))
            for peer in self._peers.values():
                if not peer.left:
                    peer.send_async(notice, tag, b"B", NO_FP, KIND_MISMATCH)
        return exc

    def mismatch_notice(self, peer: Peer, tag: int, notice: bytes) -> None:
        """A peer found the collective of ``tag`` disagrees: it fails here too."""
        detector, sender, mine, theirs = NOTICE.unpack(notice)
        exc = mismatch(Fingerprint.unpack(mine), Fingerprint.unpack(theirs), detector, sender)
        self._matcher.poison(tag, exc)
        self._ledger.mark_late(tag, exc)  # when this rank's part has already returned


class DeathHandling:
    """Deaths and goodbyes of peers: the channel breaks, or the receives on one peer fail."""

    ctx: ChannelContext
    rank: int
    size: int
    _closed: bool
    _failure: BaseException | None
    _matcher: Matcher
    _peers: dict[int, Peer]
    _p2p: ShmP2P | None
    _shm_out: dict[int, OutLink]
    _shm: SharedMemoryArena | None
    _broken_shm: SharedMemoryArena | None
    _heartbeat: Heartbeat | None

    if TYPE_CHECKING:  # DataChannel's
        def fail(self, exc: BaseException) -> bool: ...
        def peer_died(self, rank: int, exc: BaseException | None = None) -> bool: ...
        def failed_ranks(self) -> tuple[int, ...]: ...

    def _ring_broken(self, rank: int, exc: BaseException) -> None:
        """A shared-memory ring broke its rules: like a socket that did."""
        err = exc if isinstance(exc, PeerError) else PeerError(str(exc), rank=self.ctx.global_rank(rank))
        self.peer_failed(self._peers[rank], err)

    def peer_left(self, peer: Peer) -> None:
        """A goodbye: fail the receives that wait on that peer alone (after taking in what it
        wrote to shared memory before it left, which is still delivered).

        A peer that saw a death often leaves right after it: when this channel knows of a
        death, those receives get the death, not the leave (another thread may be breaking
        the channel at this moment, and its error must not lose the race to this one)."""
        exc: BaseException = left_error(peer.global_rank)
        dead = self.failed_ranks()
        if self._failure is not None:
            exc = self._failure
        elif dead:
            gr = self.ctx.global_rank(dead[0])
            exc = PeerError(f"rank {gr} died (rank {peer.global_rank} left after it)", rank=gr)
        if self._p2p is not None and peer.rank in self._shm_out:
            self._p2p.drain_from(peer.rank)
            self._p2p.fail_to(peer.rank, exc)
        self._matcher.fail_from(peer.rank, exc)

    def known_failure(self) -> BaseException | None:
        return self._failure

    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        """A connection dropped without goodbye: break the channel for every caller, and
        tell the other peers which rank it was (they may see this rank go next, and must
        not blame it; a later death is told too, so every survivor learns of each)."""
        if self._closed:
            peer.reader.fail_current(exc)
            return
        first = self.peer_died(peer.rank, exc)  # recorded before the callers wake (failed_ranks)
        peer.reader.fail_current(exc)
        if not first:
            return
        body = LOST.pack(peer.global_rank) + str(exc).encode()[:MAX_LOST_BYTES - LOST.size]
        for other in self._peers.values():
            if other is not peer and not other.left and other.rank not in self.failed_ranks():
                other.send_notice(body, KIND_PEER_LOST)  # now: this process may exit next

    def peer_lost_notice(self, peer: Peer, lost: int, reason: str) -> None:
        """A peer lost rank ``lost``: this channel is broken too, and names that rank; the
        connection to it is cut (a frozen rank others gave up on is given up on here too)."""
        exc = PeerError(f"{reason} (reported by rank {peer.global_rank})", rank=lost)
        local = self._local_rank(lost)
        if local is None or local == self.rank:
            self._break(peer, exc)
        elif self.peer_died(local, exc):  # recorded, then the channel breaks
            gone = self._peers.get(local)
            if gone is not None:
                gone.kill()

    def _tell_deaths(self) -> None:
        """Before the goodbyes: every live peer hears of each death this rank knows of, in
        the stream its goodbye follows. A peer waiting on this rank then learns the cause
        before the leave, however its threads are scheduled (a rank told of a death by a
        notice does not pass it on at once; a peer known to know it ignores it)."""
        dead = self.failed_ranks()
        if not dead:
            return
        live = [p for p in self._peers.values() if p.rank not in dead and not p.over]
        for rank in dead:
            gr = self.ctx.global_rank(rank)
            body = LOST.pack(gr) + f"rank {gr} died".encode()
            for peer in live:
                peer.send_notice(body, KIND_PEER_LOST)

    def _local_rank(self, global_rank: int) -> int | None:
        ranks = self.ctx.global_ranks
        if not ranks:
            return global_rank if 0 <= global_rank < self.size else None
        try:
            return list(ranks).index(global_rank)
        except ValueError:
            return None

    def _break(self, peer: Peer | None, exc: BaseException) -> bool:
        if not self.fail(exc):  # closed or broken already
            if peer is not None:
                peer.reader.fail_current(exc)
            return False
        self._matcher.fail_all(exc)
        if self._p2p is not None:
            self._p2p.fail_all(exc)
        for other in self._peers.values():
            other.fail_pending_sends(exc)
            other.reader.fail_current(exc)
        if self._shm is not None:  # later ops take the socket path, whose first check raises
            self._broken_shm, self._shm = self._shm, None
        return True

    def interrupt(self, exc: BaseException) -> bool:
        """Break the channel and wake every pending receive, send and arena wait."""
        return self._break(None, exc)

    def _live_peers(self) -> list[Peer]:
        dead = self.failed_ranks()
        return [p for p in self._peers.values() if not p.left and p.rank not in dead]

    def _silent(self, peer: Peer, silent_for: float) -> None:
        """The heartbeat found ``peer`` silent past the deadline: it counts as dead."""
        deadline = self._heartbeat.deadline if self._heartbeat is not None else 0.0
        self.peer_failed(peer, PeerError(
            f"rank {peer.global_rank} sent nothing for {silent_for:.1f}s, past the heartbeat deadline of "
            f"{deadline:g}s (PROCGROUP_HEARTBEAT_TIMEOUT): it is stopped or its host hung; counted as dead",
            rank=peer.global_rank))
        peer.kill()
