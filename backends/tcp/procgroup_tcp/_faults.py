"""tcp's fault handling: ranks that disagree on a collective, and peers that die or leave.

Two components the channel owns (:class:`~procgroup_tcp.channel.TcpChannel` routes its
:class:`PeerEvents` to them), kept apart from the data path:

* :class:`Mismatches`: every data frame is matched here first (``match_incoming``): a
  frame of a running collective whose fingerprint differs from this rank's is a
  mismatch; the rank that sees one first fails the collective's tag (``Matcher.poison``)
  and tells every peer with a mismatch notice. A rank whose part of a collective only
  sends finds a disagreement afterwards: a late frame, a probe from a receiver that
  waits, a notice (``_fingerprints.Ledger`` keeps it for the group's next collective).
* :class:`Deaths`: a peer lost without a goodbye fails what involves it, as MPI's ULFM
  scopes a failure (``_scope``): the sends to it and receives from it, the collectives
  of every group holding it, the any-source receives of those groups until the caller
  acknowledges the death; the other peers are told which rank it was. Point-to-point
  between live ranks and the groups without it go on. A goodbye fails only the
  receives that wait on that peer; the heartbeat's silent peer counts as dead; a revoke
  fails one group's traffic.

The first failure wins: the first death, or the first departure that failed an op here
(a goodbye is not a death, but a rank whose receive it broke may leave because of it),
is kept as this rank's first failure (:class:`FirstFailure`), and a later loss is
reported as its consequence. A rank leaving after an op of its own failed because a
rank departed first tells its live peers so (``KIND_PEER_LEFT``) before its goodbye.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from procgroup.backend import ChannelContext, Fingerprint, mismatch
from procgroup.errors import PeerError

from ._conn import Peer, left_error
from ._fingerprints import Ledger
from ._match import DISCARD, Discard, Matcher, PostedRecv, Unexpected
from ._scope import GroupScope, Scopes
from ._wire import KIND_MISMATCH, KIND_PEER_LEFT, KIND_PEER_LOST, NO_FP, NOTICE, pack_lost

#: seconds in all that passing one death on may wait for peers' send locks (see Deaths._tell_others)
TELL_BUDGET_S = 0.25
#: seconds in all that each of the notices sent at close (deaths, the first departure) may
#: wait for peers' send locks: close must end, and a peer skipped hears it from the others
CLOSE_TELL_BUDGET_S = 1.0

if TYPE_CHECKING:
    from .channel import TcpChannel

log = logging.getLogger(__name__)

__all__ = ["Deaths", "FirstFailure", "Mismatches"]


class FirstFailure(NamedTuple):
    """The first failure this rank learnt of: channel rank, its error, whether it left
    (said goodbye) rather than died."""

    rank: int
    exc: BaseException
    departed: bool


class Mismatches:
    """Fingerprints compared on the receive path; mismatches found, told and remembered.

    It works on the channel's ledger (``_fingerprints``), matcher and peers, which the
    channel hands it at set-up; the channel routes its PeerEvents here."""

    def __init__(self, ctx: ChannelContext, ledger: Ledger, matcher: Matcher, peers: dict[int, Peer]) -> None:
        self.ctx = ctx
        self.rank = ctx.rank
        self._ledger = ledger
        self._fps = ledger.active  # tag -> fingerprint of each running collective
        self._matcher = matcher
        self._peers = peers
        ledger.check_end = self.collective_ended

    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes,
                       fp: bytes) -> PostedRecv | Unexpected | Discard:
        """Where a data frame lands (every frame, socket or ring, comes here first): a frame of
        a running collective carrying another fingerprint is a mismatch (dropped), one of a
        collective this rank finished is checked against the ledger; the rest go to the
        matcher (a posted receive, or the unexpected queue)."""
        expected = self._fps.get(tag)
        if expected is not None:
            if fp != expected:
                self.mismatched(tag, expected, fp, src)
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
        self._ledger.mark_late(tag, self.mismatched(tag, entry[0], fp, src))
        return True

    def probe(self, req: PostedRecv) -> bool:
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
                self.mismatched(tag, expected, fp, peer.rank)
        elif self._ledger.done:
            self._late_frame(peer.rank, tag, fp)

    def collective_ended(self, tag: int, fp: bytes) -> BaseException | None:
        """The collective of ``tag`` ended here: a frame of another op still queued under its
        tag is a mismatch, and so is a mismatch found (or told) while it ran."""
        matcher = self._matcher
        ux = matcher.queued(tag)
        if ux is not None and ux.fp != fp:
            self.mismatched(tag, fp, ux.fp, ux)
        return matcher.dead_error(tag) if matcher.dead else None

    def mismatched(self, tag: int, mine: bytes, theirs: bytes, src: int | Unexpected) -> BaseException:
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


class Deaths:
    """Deaths, goodbyes and revokes, scoped as ULFM scopes them (see the module).

    It serves one root channel: its peers, matcher, shared-memory links and arena, and
    the SDK's record of deaths (``DataChannel.peer_died``, which calls back
    :meth:`fail_peer`); ``scopes`` holds every group on the channel's transport."""

    def __init__(self, channel: TcpChannel, scopes: Scopes) -> None:
        self._ch = channel
        self.ctx = channel.ctx
        self.scopes = scopes
        #: the first death, or departure that failed an op here (or was told), learnt
        self.first: FirstFailure | None = None
        self._first_lock = threading.Lock()
        #: an op of this rank failed because a peer left: its goodbye tells the others
        #: which departure came first (``tell_departure``)
        self.hurt_by_departure = False

    # ---------------------------------------------------------------- what the readers report
    def ring_broken(self, rank: int, exc: BaseException) -> None:
        """A shared-memory ring broke its rules: like a socket that did."""
        err = exc if isinstance(exc, PeerError) else PeerError(str(exc), rank=self.ctx.global_rank(rank))
        self.peer_failed(self._ch._peers[rank], err)

    def peer_left(self, peer: Peer) -> None:
        """A goodbye: fail the receives that wait on that peer alone (after taking in what it
        wrote to shared memory before it left, which is still delivered).

        A peer that saw a failure often leaves right after it: when this channel knows of
        an earlier one (a death, a departure), those receives get it as the cause, not the
        leave (another thread may be failing them at this moment, and its error must not
        lose the race to this one). A goodbye that fails a receive here is this rank's first
        failure when none came before."""
        ch = self._ch
        exc = ch.failure if ch.failure is not None else self.departure_error(peer, record=False)
        failed = 0
        if ch._p2p is not None and peer.rank in ch._shm_out:
            ch._p2p.drain_from(peer.rank)
            failed = ch._p2p.fail_to(peer.rank, exc)
        failed += ch._matcher.fail_from(peer.rank, exc)
        if failed and ch.failure is None:
            self._departure_failed(peer.rank, exc)

    def departure_error(self, peer: Peer, record: bool = True) -> PeerError:
        """The error of an op that fails because ``peer`` said goodbye: its departure, or
        what it followed when an earlier failure is known here (then named first).
        ``record``: the error reaches the caller now (a refusal), so the departure counts
        as a failure here; a check whose refusal may yet be retried passes False."""
        exc = left_error(peer.global_rank)
        if record:
            self._departure_failed(peer.rank, exc)
        first = self._first_failure(besides=peer.rank)
        return exc if first is None else self._after(first, peer.global_rank, exc)

    def refused(self, rank: int | None) -> None:
        """A receive's refusal reaches its caller: when channel rank ``rank`` has left, that
        departure failed an op here (``departure_error`` with ``record``)."""
        peer = None if rank is None else self._ch._peers.get(rank)
        if peer is not None and peer.left and self._ch.failure is None:
            self._departure_failed(peer.rank, left_error(peer.global_rank))

    def _departure_failed(self, rank: int, exc: BaseException) -> None:
        """An op failed here because channel rank ``rank`` left: the first failure, unless
        one came before; this rank's goodbye names the first departure (``tell_departure``)."""
        self.hurt_by_departure = True
        self._record_first(rank, exc, departed=True)

    def peer_left_notice(self, peer: Peer, gone: int, reason: str) -> None:
        """``peer`` says an op of its own failed because world rank ``gone`` left first (it
        tells this before its goodbye): that departure is the first failure here too, unless
        one came before, so the goodbye that follows is reported as its consequence. It is
        not a death: nothing else fails. A notice naming no other member is ignored."""
        local = self._local_rank(gone)
        if local is None or local == self._ch.rank or local == peer.rank:
            log.warning("rank %d sent a departure notice naming rank %d, which is not another member: ignored",
                        peer.global_rank, gone)
            return
        exc = PeerError(f"{reason} (reported by rank {peer.global_rank})", rank=gone, departed=True)
        self._record_first(local, exc, departed=True)

    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        """A connection dropped without goodbye: fail what involves that rank, after telling
        the other peers which rank it was (they may see this rank go next, and must not
        blame it; a later death is told too, so every survivor learns of each). A death
        that follows one known here is reported as its consequence: the first one is named
        first (``rank``), on every survivor, whatever order its threads read the news in."""
        ch = self._ch
        if ch.closed:
            peer.reader.fail_current(exc)
            return
        if peer.rank not in self.scopes.dead:  # news here (two threads may both tell: harmless)
            earlier = self._first_failure(besides=peer.rank)
            if earlier is not None:
                exc = self._after(earlier, peer.global_rank, exc)
            self._record_first(peer.rank, exc, departed=False)
            self._tell_others(peer.rank, peer.global_rank, str(exc), teller=None)
        ch.peer_died(peer.rank, exc)  # recorded before the callers wake (failed_ranks)
        peer.reader.fail_current(exc)

    def peer_lost_notice(self, peer: Peer, lost: int, reason: str) -> None:
        """A peer lost rank ``lost``: it is dead here too (named by that rank), and the
        connection to it is cut (a frozen rank others gave up on is given up on here too).
        A notice naming this rank means the others counted it dead: nothing works any more."""
        ch = self._ch
        exc = PeerError(f"{reason} (reported by rank {peer.global_rank})", rank=lost)
        local = self._local_rank(lost)
        if local is None or local == ch.rank:
            self.break_all(peer, exc)
            return
        if local not in self.scopes.dead:  # passed on before this rank's calls hear of it
            earlier = self._first_failure(besides=local)
            if earlier is not None:
                exc = self._after(earlier, lost, exc)
            self._record_first(local, exc, departed=False)
            self._tell_others(local, lost, reason, teller=peer)
        if ch.peer_died(local, exc):  # recorded, then what involves it fails
            gone = ch._peers.get(local)
            if gone is not None:
                gone.kill()

    def silent(self, peer: Peer, silent_for: float) -> None:
        """The heartbeat found ``peer`` silent past the deadline: it counts as dead."""
        beat = self._ch._heartbeat
        deadline = beat.deadline if beat is not None else 0.0
        self._ch.peer_suspected(peer.rank)  # maybe alive behind a cut link: shrink needs a quorum
        self.peer_failed(peer, PeerError(
            f"rank {peer.global_rank} sent nothing for {silent_for:.1f}s, past the heartbeat deadline of "
            f"{deadline:g}s (PROCGROUP_HEARTBEAT_TIMEOUT): it is stopped or its host hung; counted as dead",
            rank=peer.global_rank))
        peer.kill()

    # ---------------------------------------------------------------- what a failure fails
    def fail_peer(self, rank: int, exc: BaseException) -> None:
        """Channel rank ``rank`` died: fail its sends and receives, the collectives of the
        groups holding it (the world's among them: the arena retires, later collectives
        take the socket path, whose first check raises) and the any-source receives of
        those groups; frames it sent before dying stay deliverable."""
        ch = self._ch
        if not self.scopes.died(rank, exc):
            return
        self._record_first(rank, exc, departed=False)  # a death decided elsewhere (the agreement) too
        ch._retire_arena()
        peer = ch._peers.get(rank)
        if peer is not None:
            peer.fail_pending_sends(exc)
        p2p = ch._p2p
        if p2p is not None and rank in ch._shm_out:
            try:
                p2p.drain_from(rank)  # what it wrote before it died is still delivered
            except Exception:  # noqa: BLE001 - a torn ring: its receives fail below anyway
                pass
            p2p.fail_to(rank, exc)
        scopes = self.scopes
        ch._matcher.fail_where(lambda src, tag: scopes.involves(src, tag, rank), exc)

    def revoke_group(self, scope: GroupScope, exc: BaseException) -> None:
        """Fail every pending and later receive and send of one group (a revoke): the
        other groups on this transport go on."""
        if scope.revoked is None:  # the first revoke's error stands
            scope.revoked = exc
        self.scopes.trouble = True
        if scope is self.scopes.root:
            self._ch._retire_arena()
        self._ch._matcher.fail_where(self.scopes.of_group(scope.gid), exc)

    def break_all(self, peer: Peer | None, exc: BaseException) -> bool:
        """Break the whole transport (this rank was counted dead): every call fails."""
        ch = self._ch
        if not ch.fail(exc):  # closed or broken already
            if peer is not None:
                peer.reader.fail_current(exc)
            return False
        ch._matcher.fail_all(exc)
        if ch._p2p is not None:
            ch._p2p.fail_all(exc)
        for other in ch._peers.values():
            other.fail_pending_sends(exc)
            other.reader.fail_current(exc)
        ch._retire_arena()
        return True

    # ---------------------------------------------------------------- telling the others
    def _tell_others(self, lost: int, lost_global: int, reason: str, teller: Peer | None) -> None:
        """Tell every live peer but ``teller`` (who told this rank) that channel rank ``lost``
        is dead, before this rank's own calls hear of it: a caller may exit on that error at
        once without a goodbye, and a peer must then read the death in this rank's stream
        before the stream's end, or it would blame this rank's exit first (its threads read
        the streams of several peers in no set order). Each rank passes a death on once:
        n - 2 small notices per rank and death.

        Best effort within ``TELL_BUDGET_S`` in all: a peer whose send lock is held past it
        (a long send under way) is skipped, since the callers waiting on the dead rank, and
        this reader thread (the teller's heartbeats), must not wait on it; it hears of the
        death at this rank's goodbye (``tell_deaths``) or from the others."""
        body = pack_lost(lost_global, reason)
        dead = self.scopes.dead
        deadline = time.monotonic() + TELL_BUDGET_S
        for other in list(self._ch._peers.values()):
            if other is not teller and other.rank != lost and not other.left and other.rank not in dead:
                other.send_notice(body, KIND_PEER_LOST, wait=max(0.0, deadline - time.monotonic()))

    def _record_first(self, rank: int, exc: BaseException, departed: bool) -> None:
        """Keep (channel rank, error) as the first failure, unless one came before."""
        with self._first_lock:
            if self.first is None:
                self.first = FirstFailure(rank, exc, departed)

    def _first_failure(self, besides: int) -> FirstFailure | None:
        """The first failure this rank learnt of, other than channel rank ``besides``: the
        one recorded first (None when that one is ``besides``: what came after it does not
        come first), else the first death learnt (one not recorded here, to be safe)."""
        first = self.first
        if first is not None:
            return None if first.rank == besides else first
        for rank, exc in list(self.scopes.dead.items()):
            if rank != besides:
                return FirstFailure(rank, exc, False)
        return None

    def _after(self, first: FirstFailure, gone: int, exc: PeerError) -> PeerError:
        """Rank ``gone``'s loss or departure (``exc``) told as what followed the first
        failure (unless the rank that reported it said so already); the error's
        ``departed`` says whether the rank it names first left rather than died."""
        gr = self.ctx.global_rank(first.rank)
        text = str(exc)
        verb = "left" if first.departed else "failed"
        if not text.startswith((f"rank {gr} failed first", f"rank {gr} left first")):
            text = f"rank {gr} {verb} first ({first.exc}); then {text}, maybe because of it"
        return PeerError(text, rank=gr, ranks=(gr, gone), departed=first.departed)

    def tell_deaths(self) -> None:
        """Before the goodbyes: every live peer hears of each death this rank knows of, in
        the stream its goodbye follows. A peer waiting on this rank then learns the cause
        before the leave, however its threads are scheduled (a death learnt here was passed
        on then, but a peer that connected later, or a send that timed out, may have missed
        it; a peer that knows it already ignores it)."""
        ch = self._ch
        dead = ch.failed_ranks()
        if not dead:
            return
        live = [p for p in ch._peers.values() if p.rank not in dead and not p.over]
        deadline = time.monotonic() + CLOSE_TELL_BUDGET_S
        for rank in dead:
            gr = self.ctx.global_rank(rank)
            body = pack_lost(gr, f"rank {gr} died")
            for peer in live:
                peer.send_notice(body, KIND_PEER_LOST, wait=max(0.0, deadline - time.monotonic()))

    def tell_departure(self) -> None:
        """Before the death notices and the goodbyes: when this rank's first failure is a
        departure (a goodbye, not a death) and an op of this rank failed since (on a
        departure, or a death: ``tell_deaths`` then follows), every live peer hears which
        rank left first, in the stream its goodbye follows: a peer whose op this rank's own
        goodbye or a death then fails names that departure first. Nothing is sent
        otherwise, so a clean shutdown costs no notice."""
        first = self.first
        dead = self._ch.failed_ranks()
        if first is None or not first.departed or not (self.hurt_by_departure or dead):
            return
        gr = self.ctx.global_rank(first.rank)
        text = str(first.exc)
        body = pack_lost(gr, text.splitlines()[0] if text else f"rank {gr} left")
        deadline = time.monotonic() + CLOSE_TELL_BUDGET_S  # a peer busy with a long send is skipped
        for peer in self._ch._peers.values():
            if peer.rank != first.rank and peer.rank not in dead and not peer.over:
                peer.send_notice(body, KIND_PEER_LEFT, wait=max(0.0, deadline - time.monotonic()))

    def live_peers(self) -> list[Peer]:
        dead = self._ch.failed_ranks()
        return [p for p in self._ch._peers.values() if not p.left and p.rank not in dead]

    def refusal(self, src: int | None, tag: int) -> BaseException | None:
        """Why a receive from (or send to) ``src`` with ``tag`` may not go ahead, or None."""
        return self.scopes.refusal(src, tag)

    def _local_rank(self, global_rank: int) -> int | None:
        ranks = self.ctx.global_ranks
        if not ranks:
            return global_rank if 0 <= global_rank < self.ctx.size else None
        try:
            return list(ranks).index(global_rank)
        except ValueError:
            return None

