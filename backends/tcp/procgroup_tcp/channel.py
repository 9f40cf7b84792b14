"""TcpChannel: procgroup's default DataChannel, over one TCP connection per peer pair.

It composes the layers below it: ``_conn`` (the mesh and one Peer per remote rank),
``_match`` (posted receives and the unexpected queue, waiting through the one progress
strategy of ``_strategies``), ``_shm`` (collectives in shared memory when every rank is
on this host), ``_p2p`` (point-to-point in shared memory with each peer on this host),
``_dispatch`` (the collective dispatchers, shared with TcpSubChannel) and
``_collectives`` (which algorithm runs a collective over the sockets, by size and world
size; the pipelines are ``procgroup.algorithms.pipelined``). It is the Peers'
:class:`~procgroup_tcp._conn.PeerEvents`, and hands those events to the two components
of ``_faults``: frames land through the matcher after their fingerprint is compared
(``Mismatches``: ranks that disagree get a :class:`~procgroup.errors.MismatchError` on
every rank, and the group stays usable), and a peer lost without a goodbye fails what
involves it, as MPI's ULFM scopes a failure (``Deaths`` and ``_scope``): sends to it and
receives from it, the collectives of every group holding it, and those groups'
any-source receives until ``failure_ack``; each raises
:class:`~procgroup.errors.PeerError` naming that rank, and the rest goes on. The arena
compares the ranks' descriptions of each op itself.

A receive's path, top-down: ``do_recv``/``start_recv`` -> ``Matcher.post`` (a queued
frame is taken at once) -> ``PostedRecv.wait`` -> the matcher's one ``Progress``
strategy (``_strategies``): on the sockets ``Engine.drive`` -> ``FrameReader.read_frame``
-> ``Mismatches.match_incoming`` (``_faults``) -> ``Matcher.match_incoming`` -> the payload lands in
the receive; in shared memory ``ShmP2P.wait_until`` drains the rings into the same
``match_incoming``. docs/architecture.md draws it.

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
from typing import Any, cast

from procgroup.backend import (
    ChannelContext,
    CompletedWork,
    DataChannel,
    FutureWork,
    SubChannel,
    Work,
    fresh,
    host_address,
)
from procgroup.errors import ChannelClosedError, PeerError

from ._conn import Landing, Peer, PeerEvents, connect_mesh
from ._dispatch import TcpCollectives
from ._faults import Deaths, Mismatches
from ._fingerprints import Ledger
from ._heartbeat import Heartbeat, deadline_seconds
from ._match import Matcher, PostedRecv
from ._p2p import OutLink, ShmP2P, open_p2p
from ._progress import TICK_S, Engine, quiet_seconds, spin_seconds
from ._ring import SMALL_BYTES as SHM_SMALL_BYTES
from ._scope import GroupScope, Scopes
from ._strategies import SharedMemoryProgress, SocketProgress
from ._shm import SharedMemoryArena, all_on_one_host, host_identity
from ._wire import (
    KIND_CONTROL,
    NO_FP,
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


class ScopedGroup(TcpCollectives):
    """What the root channel and a sub-channel share of a group's failure scope
    (``_scope``, registered in the root's ``_scopes``)."""

    _scope: GroupScope
    _scopes: Scopes

    def next_collective_tag(self) -> int:
        """A collective of a group holding a dead rank (or revoked) fails at entry."""
        if self._scopes.trouble:
            refused = self._scope.collective_error()
            if refused is not None:
                raise fresh(refused)
        return super().next_collective_tag()  # DataChannel's, after this class in the MRO

    def failure_ack(self) -> None:
        """Acknowledge the deaths known now: any-source receives hear the live ranks again."""
        self._scope.ack()

    def failure_get_acked(self) -> list[int]:
        """The acknowledged dead, in this channel's numbering."""
        return self._scope.acked_ranks()


class TcpChannel(ScopedGroup, DataChannel, PeerEvents):
    """The tcp backend's communicator; see the module docstring for the layers."""

    backend_name = "tcp"
    cancels_recv = True  # the matcher withdraws a receive no frame has matched

    def __init__(self, ctx: ChannelContext) -> None:
        super().__init__(ctx)
        self._init_collectives(Ledger())
        self._peers: dict[int, Peer] = {}
        self._shm: SharedMemoryArena | None = None
        self._broken_shm: SharedMemoryArena | None = None  # the arena of a broken channel, unused
        self._p2p: ShmP2P | None = None
        self._shm_out: dict[int, OutLink] = {}  # same-host peers whose messages go through shared memory
        self._matcher = Matcher(ctx.timeout, ctx.global_rank, self._may_post, self._probe)
        self._mismatches = Mismatches(ctx, self._ledger, self._matcher, self._peers)
        #: every frame's landing is the Mismatches' (bound once: on every frame's path)
        self.match_incoming = self._mismatches.match_incoming  # type: ignore[method-assign]  # bound once per channel
        self._scope = GroupScope(ctx.group_id, {r: r for r in range(ctx.size)}, ctx.global_rank)
        self._deaths = Deaths(self, Scopes(self._scope))
        self._scopes = self._deaths.scopes
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
                self._shm = SharedMemoryArena.open(ctx, self._check_and_progress, self._left, self._arena_broken)
            self._p2p = open_p2p(ctx, self._peers, self._matcher, sockets_only, self.check_usable,
                                 self._left, self.match_incoming, self._deaths.ring_broken)
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
                self._heartbeat = Heartbeat(self._deaths.live_peers, deadline, self._deaths.silent,
                                            f"procgroup-tcp-heartbeat-g{ctx.group_id}")
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- peers
    def _peer(self, rank: int, tag: int) -> Peer:
        """The peer a send with ``tag`` goes to, once nothing refuses it: the channel is open,
        the peer lives and has not left, its group (``tag``'s) can still send (``_scope``)."""
        self.check_usable()
        peer = self._peers.get(rank)
        if peer is None:
            raise PeerError(f"rank {self.ctx.global_rank(rank)} is not a peer of this channel", rank=rank)
        refused = self._deaths.refusal(rank, tag)
        if refused is not None:
            raise fresh(refused)
        if peer.left:
            raise self._deaths.departure_error(peer)
        return peer

    def _left(self, rank: int) -> BaseException | None:
        """The error of a wait that the goodbye of channel rank ``rank`` ends (None while it
        has not said goodbye): the departure, or what it followed (``Deaths.departure_error``).
        The arena's and shared-memory sends' waits ask this."""
        peer = self._peers.get(rank)
        return self._deaths.departure_error(peer) if peer is not None and peer.left else None

    def _check_and_progress(self) -> None:
        """The arena's periodic check while it waits (every rank is a member of its
        collectives: any death or a revoke ends them): a rank blocked in a collective still
        takes in what same-host peers send it, so their sends never wait on it forever."""
        self.check_usable()
        if self._scopes.trouble:
            refused = self._scope.collective_error()
            if refused is not None:
                raise fresh(refused)
        if self._p2p is not None:
            self._p2p.progress()

    def _may_post(self, src: int | None, tag: int = 0) -> None:
        """The matcher asks, under its lock, before it posts a receive (and before an
        any-source receive takes a queued frame); a direct receive asks with the peer's
        rank alone once that peer is over (its death or leave refuses any tag). A departure's
        refusal is not recorded here (a receive from shared memory drains the ring and posts
        again): where it reaches the caller, ``Deaths.refused`` records it."""
        self.check_usable()
        if self._scopes.trouble:
            refused = self._deaths.refusal(src, tag)
            if refused is not None:
                raise fresh(refused)
        if src is not None and self._peers[src].left:
            raise self._deaths.departure_error(self._peers[src], record=False)

    def _probe(self, req: PostedRecv) -> bool:
        return self._mismatches.probe(req)

    def _retire_arena(self) -> None:
        """The world's collectives cannot run any more (a death, a revoke): later ones take
        the socket path, whose first check raises; the arena stays mapped until close."""
        if self._shm is not None:
            self._broken_shm, self._shm = self._shm, None

    def _arena_broken(self, exc: BaseException) -> None:
        """An arena op failed: after a death, the arena retires (the death already fails
        the world's collectives, naming the dead); else (the ranks disagreed, or timed
        out) the world group is given up as a revoke gives it up. The other groups on this
        transport go on either way."""
        if self._scope.dead:
            self._retire_arena()
        else:
            self._deaths.revoke_group(self._scope, exc)

    # ---------------------------------------------------------------- PeerEvents
    # Frames and mismatch notices go to the Mismatches, deaths and goodbyes to the Deaths
    # (``_faults``); match_incoming is rebound to the Mismatches' at set-up.
    def match_incoming(self, src: int, tag: int, nbytes: int, dtype_char: bytes, fp: bytes) -> Landing:
        return self._mismatches.match_incoming(src, tag, nbytes, dtype_char, fp)

    def mismatch_notice(self, peer: Peer, tag: int, notice: bytes) -> None:
        self._mismatches.mismatch_notice(peer, tag, notice)

    def fingerprint_probe(self, peer: Peer, tag: int, fp: bytes) -> None:
        self._mismatches.fingerprint_probe(peer, tag, fp)

    def peer_left(self, peer: Peer) -> None:
        self._deaths.peer_left(peer)

    def peer_failed(self, peer: Peer, exc: PeerError) -> None:
        self._deaths.peer_failed(peer, exc)

    def peer_lost_notice(self, peer: Peer, lost: int, reason: str) -> None:
        self._deaths.peer_lost_notice(peer, lost, reason)

    def peer_left_notice(self, peer: Peer, gone: int, reason: str) -> None:
        self._deaths.peer_left_notice(peer, gone, reason)

    def known_failure(self) -> BaseException | None:
        return self._failure

    # ---------------------------------------------------------------- failure scope (ULFM)
    def fail_peer(self, rank: int, exc: BaseException) -> None:
        """A death fails what involves that rank only (``_faults.Deaths.fail_peer``)."""
        self._deaths.fail_peer(rank, exc)

    def interrupt(self, exc: BaseException) -> bool:
        """A revoke of this group: its pending and later ops fail; groups riding on this
        transport go on (ULFM revokes one communicator)."""
        first = self._scope.revoked is None
        self._deaths.revoke_group(self._scope, exc)
        return first

    # ---------------------------------------------------------------- surviving a death
    def do_control_send(self, dst: int, payload: bytes) -> None:
        peer = self._peers.get(dst)
        if peer is None or peer.left:
            raise PeerError(f"rank {self.ctx.global_rank(dst)} is not reachable", rank=dst)
        peer.send_notice(payload, KIND_CONTROL, wait=self.timeout)

    def control_message(self, peer: Peer, body: bytes) -> None:
        self.control_received(peer.rank, body)

    # ---------------------------------------------------------------- point to point
    # Same-host peers (``self._shm_out``) go through shared memory (``_p2p``), the others
    # over their socket; a receive is posted in the one matcher either way.
    def do_send(self, array: Any, dst: int, tag: int = 0) -> None:
        peer = self._peers.get(dst)
        if peer is None or peer.state.left or self._failure is not None or self._closed or self._scopes.trouble:
            peer = self._peer(dst, tag)  # raises the error that fits
        dtype = array.dtype
        code = DTYPE_CODES.get(dtype) or dtype_code(dtype)
        if self._shm_out:
            link = self._shm_out.get(dst)
            if link is not None:
                # a small message as a bytes copy: cheaper than a buffer view of the array
                if array.nbytes <= SHM_SMALL_BYTES and self._p2p.send_small(link, array.tobytes(), tag, code, self._fps.get(tag, NO_FP)):  # type: ignore[union-attr]  # a link exists only with p2p
                    return
                self._p2p.send(link, byte_view(array), tag, code, self._fps.get(tag, NO_FP))  # type: ignore[union-attr]  # a link exists only with p2p
                return
        try:
            view = memoryview(array).cast("B")  # byte_view, inline: on every message's path
        except (TypeError, ValueError):
            view = byte_view(array)
        peer.send(view, tag, code, self._fps.get(tag, NO_FP))

    def start_send(self, array: Any, dst: int, tag: int = 0) -> Work:
        peer = self._peer(dst, tag)
        link = self._shm_out.get(dst)
        if link is not None:
            return self._p2p.isend(link, byte_view(array), tag, dtype_code(array.dtype), self._fps.get(tag, NO_FP))  # type: ignore[union-attr]  # a link exists only with p2p
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
        otherwise it is posted and this thread reads until it lands. From a same-host peer, a
        small message that nothing could claim before it is taken from its ring the same way
        (``ShmP2P.recv_direct``)."""
        if self._shm_out and src in self._shm_out:
            m = self._matcher
            if (not m.posted and not m.unexpected and not m.dead and tag not in self._fps
                    and tag not in self._ledger.done and self._failure is None and not self._closed
                    and not self._scopes.trouble and not self._peers[src].state.left):
                got = self._p2p.recv_direct(src, array, tag)  # type: ignore[union-attr]  # a link exists only with p2p
                if got >= 0:
                    return got
        peer = self._peers.get(src) if self._direct and src is not None else None
        if peer is None or peer.state.left or self._failure is not None or self._closed or self._scopes.trouble:
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
                    if (not m.posted and not m.unexpected) or m.unclaimed(src, tag):  # type: ignore[arg-type]  # src is a rank here: peer was found
                        dtype = array.dtype
                        code = DTYPE_CODES.get(dtype) or dtype_code(dtype)
                        try:
                            reader.receive_direct(view, code, dtype, tag, self._may_post)
                        except PeerError:
                            self._deaths.refused(src)
                            raise
                        return src  # type: ignore[return-value]  # src is a rank here: peer was found
                finally:
                    reader.driven_at = _now()
                    gate.release()
        try:
            req = self._matcher.post(view, src, tag, array.dtype, self._fps.get(tag), self._mismatches.mismatched)
        except PeerError:
            self._deaths.refused(src)
            raise
        if req.__class__ is not PostedRecv:  # served from the unexpected queue
            return int(req.result())
        if not req.completed and not self._matcher.settle(req, self.timeout):
            req.timed_out(self.timeout, False)
        if req.error is not None:
            raise fresh(req.error)
        return req.sender

    def start_recv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        self.check_usable()
        if src is not None and src not in self._peers:
            raise PeerError(f"rank {self.ctx.global_rank(src)} is not a peer of this channel", rank=src)
        try:
            return self._post(array, src, tag)
        except PeerError:
            self._deaths.refused(src)
            raise

    def _post(self, array: Any, src: int | None, tag: int) -> Work:
        """Post a receive (start_recv); from a same-host peer that left, after taking in
        what it wrote to its ring before its goodbye."""
        args = (byte_view(array), src, tag, array.dtype, self._fps.get(tag), self._mismatches.mismatched)
        try:
            return self._matcher.post(*args)
        except PeerError:
            if self._p2p is None or src is None or src not in self._shm_out or not self._peers[src].left:
                raise
        # the peer left: what it wrote before its goodbye may still sit in its ring
        self._p2p.drain_from(src)
        return self._matcher.post(*args)

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
        self._deaths.tell_departure()  # a departure before the deaths: it came first
        self._deaths.tell_deaths()
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


class TcpSubChannel(ScopedGroup, SubChannel):
    """A group on its parent's sockets; its collectives (the same dispatchers as the
    root's, never in the arena) register their fingerprints in the root channel's
    ledger, which the root's receive path compares. Its failure scope (``_scope``) is
    registered with the root, whose receive path asks it: a death of a member fails the
    group's collectives and unacknowledged any-source receives, a death outside it
    nothing here; a revoke of it fails its traffic only."""

    def __init__(self, parent: DataChannel, ranks: Sequence[int], ctx: ChannelContext) -> None:
        super().__init__(parent, ranks, ctx)
        self._init_collectives(parent._ledger)  # type: ignore[attr-defined]  # a TcpChannel or TcpSubChannel
        self._root: TcpChannel
        self._root_ranks: tuple[int, ...]
        if isinstance(parent, TcpSubChannel):
            self._root = parent._root
            self._root_ranks = tuple(parent._root_ranks[r] for r in ranks)
        else:  # new_group of the two classes here only
            self._root, self._root_ranks = cast("TcpChannel", parent), tuple(ranks)
        self._scope = GroupScope(ctx.group_id, {r: i for i, r in enumerate(self._root_ranks)}, ctx.global_rank)
        self._scopes = self._root._scopes
        self._scopes.add(self._scope)

    def new_group(self, ranks: Sequence[int], ctx: ChannelContext) -> DataChannel:
        return TcpSubChannel(self, ranks, ctx)

    # ---------------------------------------------------------------- failure scope (ULFM)
    def fail_peer(self, rank: int, exc: BaseException) -> None:
        """A member died: the root's Deaths fail what involves it, in every group holding
        it (once: a death the root saw itself comes here too, through its carried channels;
        not through the root's peer_died, which is reporting it at that moment)."""
        self._root._deaths.fail_peer(self._root_ranks[rank], exc)

    def interrupt(self, exc: BaseException) -> bool:
        """A revoke of this group: its own pending and later ops fail, nothing else."""
        first = self.fail(exc)
        self._root._deaths.revoke_group(self._scope, exc)
        return first

    def do_close(self) -> None:
        self._scopes.remove(self._scope.gid)
        self._plan.scratch.release()
        super().do_close()


__all__ = ["DIRECT_RECV_BYTES", "INLINE_SEND_BYTES", "TcpChannel", "TcpSubChannel"]
