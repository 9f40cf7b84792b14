"""TcpChannel: procgroup's default DataChannel, over one TCP connection per peer pair.

It composes the layers below it: ``_conn`` (the mesh and one Peer per remote rank),
``_match`` (posted receives and the unexpected queue, waiting through the one progress
strategy of ``_strategies``), ``_shm`` (collectives in shared memory when every rank is
on this host), ``_p2p`` (point-to-point in shared memory with each peer on this host),
``_dispatch`` (the collective dispatchers, shared with TcpSubChannel) and
``_collectives`` (which algorithm runs a collective over the sockets, by size and world
size; the pipelines are ``procgroup.algorithms.pipelined``). It is
the Peers' :class:`~procgroup_tcp._conn.PeerEvents`: frames land
through the matcher, and a peer lost without a goodbye breaks the channel
(:meth:`~procgroup.backend.DataChannel.fail`): every pending and later call raises
:class:`~procgroup.errors.PeerError` naming that rank.

Agreement: every collective over the sockets carries its op's fingerprint in its
frames (``_fingerprints``), the arena compares the ranks' descriptions of each op;
ranks that disagree get a :class:`~procgroup.errors.MismatchError` on every rank
(the rank that sees it first tells every peer with a mismatch notice), and the
group stays usable.

Ops, in the SDK's forms: a send to a same-host peer goes through its shared-memory
ring (``_p2p``), and every receive is posted in the one matcher, whose waits then
drive the rings too; otherwise ``start_recv`` posts a receive (its Work is the posted
receive itself); ``start_send`` writes small messages inline and queues large ones on
the peer's sender thread; ``do_send`` writes on the caller's thread, cheaper than a
queued send plus a wait. Collectives run in the arena when it is open, else over the
sockets (all_reduce, broadcast and reduce as ``_collectives`` picks, the rest with the
base's algorithms).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from procgroup.backend import (
    ChannelContext,
    CompletedWork,
    DataChannel,
    Fingerprint,
    FutureWork,
    SubChannel,
    Work,
    fresh,
    host_address,
    mismatch,
)
from procgroup.errors import ChannelClosedError, PeerError

from ._conn import Peer, PeerEvents, connect_mesh, left_error
from ._dispatch import TcpCollectives
from ._fingerprints import Ledger
from ._heartbeat import Heartbeat, deadline_seconds
from ._match import DISCARD, Discard, Matcher, PostedRecv, Unexpected
from ._p2p import OutLink, ShmP2P, open_p2p
from ._progress import TICK_S, Engine, quiet_seconds, spin_seconds
from ._strategies import SharedMemoryProgress, SocketProgress
from ._shm import SharedMemoryArena, all_on_one_host, host_identity
from ._wire import (
    KIND_CONTROL,
    KIND_MISMATCH,
    KIND_PEER_LOST,
    LOST,
    MAX_LOST_BYTES,
    NO_FP,
    NOTICE,
    DTYPE_CODES,
    byte_view,
    dtype_code,
)

log = logging.getLogger(__name__)
_now = time.monotonic

#: A started send of at most this many bytes is written inline (the kernel buffer absorbs it).
INLINE_SEND_BYTES = 256 * 1024
#: A blocking receive of at most this many bytes may land unposted (``do_recv``): its
#: payload takes no time to read, so a failure elsewhere is seen as soon as with a posted one.
DIRECT_RECV_BYTES = 64 * 1024


class TcpChannel(TcpCollectives, DataChannel, PeerEvents):
    """The tcp backend's communicator; see the module docstring for the layers."""

    backend_name = "tcp"
    cancels_recv = True  # the matcher withdraws a receive no frame has matched

    def __init__(self, ctx: ChannelContext) -> None:
        super().__init__(ctx)
        self._init_collectives(Ledger())
        self._ledger.check_end = self._collective_ended
        self._peers: dict[int, Peer] = {}
        self._shm: SharedMemoryArena | None = None
        self._broken_shm: SharedMemoryArena | None = None  # the arena of a broken channel, unused
        self._p2p: ShmP2P | None = None
        self._shm_out: dict[int, OutLink] = {}  # same-host peers whose messages go through shared memory
        self._matcher = Matcher(ctx.timeout, ctx.global_rank, self._may_post, self._probe)
        self._heartbeat: Heartbeat | None = None
        self._engine = Engine()  # who reads the sockets: waiting callers, else reader threads
        self._direct = False
        self._peer_list: list[Peer] = []
        if ctx.size == 1:
            return
        on_host = f"tcp/ranks-on/{host_identity()}"
        ctx.store.add(on_host, 1)  # before connect_mesh publishes this rank's address
        sockets = connect_mesh(ctx, host_address(ctx))
        for rank, sock in sockets.items():
            self._peers[rank] = Peer(rank, ctx.global_rank(rank), sock, ctx.timeout, self, self._engine)
        self._peer_list = list(self._peers.values())
        self._engine.quiet = quiet_seconds(len(self._peer_list))
        # every peer has published its address, so every rank of this host has counted itself
        spin = spin_seconds(ctx.store.add(on_host, 0))
        for peer in self._peer_list:
            peer.reader.spin = spin
        sockets_only = SocketProgress(self._engine, self._peers, self._matcher)
        #: a blocking receive reads its peer's frames itself (no shared-memory p2p, whose
        #: waits sleep on the doorbell; and a timeout the kernel's read tick cannot overshoot)
        self._direct = ctx.timeout >= TICK_S
        try:
            for peer in self._peers.values():
                peer.start_reader()
            # option arena=False: a channel whose collectives never run here (a side channel:
            # its point-to-point still takes shared memory); shm=False: no shared memory at all
            wanted = ctx.options.get("shm")
            arena = ctx.options.get("arena")
            if (wanted is None or wanted) and (arena is None or arena) and all_on_one_host(ctx):
                # None: /dev/shm refused, sockets it is
                self._shm = SharedMemoryArena.open(ctx, self._check_and_progress, self._has_left, self.fail)
            self._p2p = open_p2p(ctx, self._peers, self._matcher, sockets_only, self.check_usable,
                                 self._has_left, self.match_incoming, self._ring_broken)
            if self._p2p is None:
                self._matcher.start(sockets_only)
            else:
                self._shm_out = self._p2p.out
                self._matcher.start(SharedMemoryProgress(self._p2p))
                # waits sleep on the doorbell, which a landed socket frame rings: the reader
                # threads read every socket from now on (they stood back during the set-up)
                self._direct = False
                self._engine.resume(self._peer_list)
            deadline = deadline_seconds(ctx.options)
            if deadline:
                self._heartbeat = Heartbeat(self._live_peers, deadline, self._silent,
                                            f"procgroup-tcp-heartbeat-g{ctx.group_id}")
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- peers
    def _peer(self, rank: int) -> Peer:
        self.check_usable()
        peer = self._peers.get(rank)
        if peer is None:
            raise PeerError(f"rank {self.ctx.global_rank(rank)} is not a peer of this channel", rank=rank)
        if peer.left:
            raise left_error(peer.global_rank)
        return peer

    def _has_left(self, rank: int) -> bool:
        """The peer said goodbye (destroy_process_group); the arena's waits ask this."""
        peer = self._peers.get(rank)
        return peer is not None and peer.left

    def _check_and_progress(self) -> None:
        """The arena's periodic check while it waits: a rank blocked in a collective still
        takes in what same-host peers send it, so their sends never wait on it forever."""
        self.check_usable()
        if self._p2p is not None:
            self._p2p.progress()

    def _ring_broken(self, rank: int, exc: PeerError) -> None:
        """A shared-memory ring broke its rules: like a socket that did."""
        self.peer_failed(self._peers[rank], exc)

    def _may_post(self, src: int | None) -> None:
        """The matcher asks, under its lock, before it posts a receive."""
        self.check_usable()
        if src is not None and self._peers[src].left:
            raise left_error(self._peers[src].global_rank)

    # ---------------------------------------------------------------- PeerEvents
    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes,
                       fp: bytes) -> PostedRecv | Unexpected | Discard:
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

    # ---------------------------------------------------------------- surviving a death
    def interrupt(self, exc: BaseException) -> bool:
        """Break the channel and wake every pending receive, send and arena wait."""
        return self._break(None, exc)

    def do_control_send(self, dst: int, payload: bytes) -> None:
        peer = self._peers.get(dst)
        if peer is None or peer.left:
            raise PeerError(f"rank {self.ctx.global_rank(dst)} is not reachable", rank=dst)
        peer.send_notice(payload, KIND_CONTROL, wait=self.timeout)

    def control_message(self, peer: Peer, body: bytes) -> None:
        self.control_received(peer.rank, body)

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

    # ---------------------------------------------------------------- point to point
    # Same-host peers (``self._shm_out``) go through shared memory (``_p2p``), the others
    # over their socket; a receive is posted in the one matcher either way.
    def do_send(self, array: Any, dst: int, tag: int = 0) -> None:
        peer = self._peers.get(dst)
        if peer is None or peer.state.left or self._failure is not None or self._closed:
            peer = self._peer(dst)  # raises the error that fits
        try:
            view = memoryview(array).cast("B")  # byte_view, inline: on every message's path
        except (TypeError, ValueError):
            view = byte_view(array)
        dtype = array.dtype
        code = DTYPE_CODES.get(dtype) or dtype_code(dtype)
        if self._shm_out:
            link = self._shm_out.get(dst)
            if link is not None:
                self._p2p.send(link, view, tag, code, self._fps.get(tag, NO_FP))  # type: ignore[union-attr]
                return
        peer.send(view, tag, code, self._fps.get(tag, NO_FP))

    def start_send(self, array: Any, dst: int, tag: int = 0) -> Work:
        peer = self._peer(dst)
        link = self._shm_out.get(dst)
        if link is not None:
            return self._p2p.isend(link, byte_view(array), tag, dtype_code(array.dtype), self._fps.get(tag, NO_FP))  # type: ignore[union-attr]
        view = byte_view(array)
        dtype_char = dtype_code(array.dtype)
        fp = self._fps.get(tag, NO_FP)
        if view.nbytes <= INLINE_SEND_BYTES and not peer.has_queued_sends:
            peer.send(view, tag, dtype_char, fp)
            return CompletedWork("isend")
        return FutureWork("isend", peer.send_async(view, tag, dtype_char, fp))

    def do_recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        """A blocking receive. On the sockets (no shared memory) from one peer it reads that
        peer's frames on this thread (``_progress``): a small user message that nothing
        posted or queued before it could claim lands straight in ``array`` (no matching);
        otherwise it is posted and this thread reads until it lands."""
        peer = self._peers.get(src) if self._direct and src is not None else None  # type: ignore[arg-type]
        if peer is None or peer.state.left or self._failure is not None or self._closed:
            work = self.start_recv(array, src, tag)
            work.wait()
            return int(work.result())
        try:
            view = memoryview(array).cast("B")  # byte_view, inline: on every message's path
        except (TypeError, ValueError):
            view = byte_view(array)
        if view.nbytes <= DIRECT_RECV_BYTES and tag not in self._fps:
            reader = peer.reader
            gate = reader.gate
            if gate.acquire(False):
                try:
                    m = self._matcher
                    if (not m.posted and not m.unexpected) or m.unclaimed(src, tag):  # type: ignore[arg-type]
                        dtype = array.dtype
                        code = DTYPE_CODES.get(dtype) or dtype_code(dtype)
                        reader.receive_direct(view, code, dtype, tag, self._may_post)
                        return src  # type: ignore[return-value]
                finally:
                    reader.driven_at = _now()
                    gate.release()
        req = self._matcher.post(view, src, tag, array.dtype, self._fps.get(tag), self._mismatched)
        if req.__class__ is not PostedRecv:  # served from the unexpected queue
            return int(req.result())
        if not req.completed and not self._matcher.settle(req, self.timeout):  # type: ignore[arg-type]
            req.timed_out(self.timeout, False)  # type: ignore[attr-defined]
        if req.error is not None:  # type: ignore[attr-defined]
            raise fresh(req.error)  # type: ignore[attr-defined]
        return req.sender  # type: ignore[attr-defined,no-any-return]

    def start_recv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        self.check_usable()
        if src is not None and src not in self._peers:
            raise PeerError(f"rank {self.ctx.global_rank(src)} is not a peer of this channel", rank=src)
        p2p = self._p2p
        if p2p is None:
            return self._matcher.post(byte_view(array), src, tag, array.dtype, self._fps.get(tag), self._mismatched)
        try:
            return self._matcher.post(byte_view(array), src, tag, array.dtype, self._fps.get(tag), self._mismatched)
        except PeerError:
            if src is None or src not in self._shm_out or not self._peers[src].left:
                raise
        # the peer left: what it wrote before its goodbye may still sit in its ring
        p2p.drain_from(src)
        return self._matcher.post(byte_view(array), src, tag, array.dtype, self._fps.get(tag), self._mismatched)

    # ---------------------------------------------------------------- collectives
    # The nine dispatchers are TcpCollectives' (``_dispatch``), shared with TcpSubChannel:
    # the shared-memory arena when it is open, else the sockets under each op's fingerprint.

    # ---------------------------------------------------------------- groups
    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        """A sub-channel on these sockets whose collectives carry fingerprints too."""
        return TcpSubChannel(self, ranks, ctx)

    # ---------------------------------------------------------------- teardown
    def do_close(self) -> None:
        """Say goodbye to every peer, fail what is pending, unmap the arena."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._tell_deaths()
        for peer in self._peers.values():
            peer.close()
        self._engine.stop()
        exc = ChannelClosedError("the tcp channel was closed while this call was pending")
        self._matcher.fail_all(exc)
        for peer in self._peers.values():
            peer.reader.fail_current(exc)
        for arena in (self._shm, self._broken_shm):
            if arena is not None:
                arena.close()
        self._plan.scratch.release()
        if self._p2p is not None:
            self._p2p.close()


class TcpSubChannel(TcpCollectives, SubChannel):
    """A group on its parent's sockets; its collectives (the same dispatchers as the
    root's, never in the arena) register their fingerprints in the root channel's
    ledger, which the root's receive path compares."""

    def __init__(self, parent: DataChannel, ranks: Sequence[int], ctx: ChannelContext) -> None:
        super().__init__(parent, ranks, ctx)
        self._init_collectives(parent._ledger)  # type: ignore[attr-defined]  # a TcpChannel or TcpSubChannel

    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        return TcpSubChannel(self, ranks, ctx)

    def do_close(self) -> None:
        self._plan.scratch.release()


__all__ = ["DIRECT_RECV_BYTES", "INLINE_SEND_BYTES", "TcpChannel", "TcpSubChannel"]
