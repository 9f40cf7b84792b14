"""Survivors go on: revoke, agree, shrink and failed_ranks (docs/fault-tolerance.md).

The mechanism (the dead set, revoke notices, the agreement) lives in the backend SDK
(:mod:`procgroup.backend._survival`), over each backend's control plane. Here: the
public functions, and what shrink does with a decision: a new Store hosted by the
lowest live rank (the agreement's coordinator; rank 0 may be dead), a new channel of
the same backend among the survivors, a second agreement that every survivor built
it, and for the world the replacement of the default group.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import _ops, _state
from ._settings import Timeout, timeout_seconds
from .backend import ChannelContext, DataChannel, choose_address
from .errors import (
    CommTimeoutError,
    InvalidArgumentError,
    PeerError,
    ProcGroupError,
    StoreTimeoutError,
)
from .groups import Group, GroupArg
from .rendezvous import PrefixStore, Store

log = logging.getLogger(__name__)


def revoke(group: GroupArg = None) -> None:
    """Make every live member's pending and later ops on ``group`` fail promptly with
    GroupRevokedError. A local call: the other members hear of it over the group's own
    connections. Then shrink() the group to go on."""
    _state.group_channel(group, "revoke").revoke()


def failed_ranks(group: GroupArg = None) -> tuple[int, ...]:
    """The ranks of ``group`` known dead here, in the group's numbering."""
    return _state.group_channel(group, "failed_ranks").failed_ranks()


def agree(flag: bool, group: GroupArg = None, timeout: Timeout = None) -> bool:
    """The AND of ``flag`` over the live members of ``group``, the same on every survivor
    even when a member dies during the call (ULFM's agreement). Collective."""
    if not isinstance(flag, (bool, int, np.bool_)):
        raise InvalidArgumentError(f"agree: flag must be a bool, got {type(flag).__name__}")
    channel = _state.group_channel(group, "agree")
    return channel.agree(bool(flag), _timeout(timeout, channel)).value


def _timeout(timeout: Timeout, channel: DataChannel) -> float:
    """The call's timeout, else the group's own (new_group(timeout=...)), in seconds."""
    return channel.timeout if timeout is None else timeout_seconds(timeout)


def _check_quorum(g: Group, members: list[int], suspected: frozenset[int]) -> None:
    """A shrink that drops a rank that only went silent (a cut link looks the same as a
    hung host) goes on only on a majority of the group: more than half of its members,
    or exactly half holding its rank 0. Both sides of a partition decide alike, so at
    most one side goes on; the other fails here on every member."""
    if not suspected:
        return
    n, live = g.size, len(members)
    if 2 * live > n or (2 * live == n and 0 in members):
        return
    silent = sorted(g.global_rank(r) for r in suspected)
    raise PeerError(
        f"shrink: rank(s) {silent} went silent (a cut link or a hung host, maybe alive) and the "
        f"{live} member(s) left on this side are not a majority of the group's {n} (more than half, or "
        f"exactly half holding its rank 0): this side of a partition must not go on as the group; "
        f"stop here (docs/fault-tolerance.md, 'Cut links')", rank=silent[0], ranks=silent)


class _WatchedStore(PrefixStore):
    """A PrefixStore whose waits are cut into short slices, between which ``abort``
    may raise: a set-up among survivors never waits out its timeout for a dead member."""

    def __init__(self, prefix: str, store: Store, abort: Callable[[], None]) -> None:
        super().__init__(prefix, store)
        self._abort = abort

    def get(self, key: str, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + self._t(timeout)
        while True:
            self._abort()
            try:
                return super().get(key, min(0.05, max(deadline - time.monotonic(), 0.001)))
            except StoreTimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        deadline = time.monotonic() + self._t(timeout)
        while True:
            self._abort()
            try:
                return super().wait(keys, min(0.05, max(deadline - time.monotonic(), 0.001)))
            except StoreTimeoutError:
                if time.monotonic() >= deadline:
                    raise


class _StoreHost:
    """The Store server this rank starts if it coordinates the shrink (lowest live rank)."""

    def __init__(self, st: _state.State) -> None:
        self.st = st
        self.server: Any = None
        self.address = ""

    def offer(self) -> bytes:
        """The agreement's ``extra``: host:port:attempt of a Store served here."""
        from .rendezvous._tcp_server import StoreServer

        if self.server is None:
            host = choose_address(self.st.master_addr, _ifname(self.st))
            self.server = StoreServer(0, self.st.job_key, host)
            self.address = f"{self.server.bound or host}:{self.server.port}"
        return f"{self.address}:{os.urandom(6).hex()}".encode()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def _ifname(st: _state.State) -> str | None:
    value = st.options.get("ifname")
    return None if value is None else str(value)


def shrink(group: GroupArg = None, timeout: Timeout = None) -> Group:
    """A new group of the live members of ``group``, ranked in their old order.

    Collective over the survivors. For the default group it replaces the world: from
    then on get_rank(), get_world_size() and every op without ``group=`` use the new
    numbering, and handles of the old groups raise GroupRevokedError naming the dead.
    Works whichever rank died (rank 0 included), after further deaths, and when a
    member dies during the call (the survivors agree again and retry). When a dropped
    rank only went silent (a cut link, a hung host), only a majority of the group goes
    on: the other side raises PeerError saying so.
    """
    st = _state.world()
    g = _state.member(group, "shrink")
    old = _state.group_channel(group, "shrink")
    secs = _timeout(timeout, old)
    deadline = time.monotonic() + secs
    host = _StoreHost(st)
    attempt = 0
    kept_server = False
    try:
        while True:
            attempt += 1
            decision = old.agree(True, _left(deadline, secs), host.offer)
            members = [r for r in range(g.size) if r not in decision.dead]
            _check_quorum(g, members, decision.suspected)
            built: tuple[DataChannel, Store] | None = None
            try:
                built = _build(st, g, old, members, decision.extra.decode(), _left(deadline, secs))
            except (ProcGroupError, OSError) as exc:
                log.info("shrink attempt %d: building the channel among %s failed: %s", attempt, members, exc)
            commit = old.agree(built is not None, _left(deadline, secs))
            if commit.value and built is not None and not commit.dead.intersection(members):
                channel, store = built
                kept_server = host.server is not None and decision.extra.decode().startswith(host.address)
                return _install(st, g, members, sorted(commit.dead | decision.dead), channel, store,
                                host.server if kept_server else None)
            if built is not None:
                _close_quietly(built[0], built[1])
    finally:
        if not kept_server:
            host.stop()


def _left(deadline: float, secs: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise CommTimeoutError(f"shrink: the survivors did not build a new group within {secs:g}s", op="shrink")
    return left


def _build(st: _state.State, g: Group, old: DataChannel, members: list[int], extra: str,
           timeout: float) -> tuple[DataChannel, Store]:
    """This rank's channel of the new group, over a client of the coordinator's Store."""
    from .rendezvous import TCPStore

    if g.rank not in members:
        raise PeerError(f"shrink: the survivors counted this rank (rank {g.global_rank(g.rank)}) as dead",
                        rank=g.global_rank(g.rank))
    try:
        host, port, attempt = extra.rsplit(":", 2)
        port_no = int(port)
    except ValueError:
        raise PeerError(f"shrink: the coordinator sent a malformed Store address {extra!r}") from None

    def abort() -> None:
        gone = [r for r in old.failed_ranks() if r in members]
        if gone:
            raise PeerError(f"shrink: rank(s) {[g.global_rank(r) for r in gone]} died while the survivors "
                            f"were building the new group", rank=g.global_rank(gone[0]))

    store = TCPStore(host, port_no, job_key=st.job_key, timeout=timeout)
    try:
        is_world = g is st.world
        label = "world" if is_world else "group"
        new_rank = members.index(g.rank)
        global_ranks = tuple(range(len(members))) if is_world else tuple(g.ranks[m] for m in members)
        ctx = ChannelContext(
            rank=new_rank, size=len(members),
            store=_WatchedStore(f"shrink/{attempt}/pg/{label}{g.group_id}", store, abort),
            timeout=old.timeout, master_addr=st.master_addr, global_ranks=global_ranks,
            group_id=g.group_id, options=dict(st.options), open_side_channel=_state.open_side_channel,
            job_key=st.job_key, abort=abort,
        )
        return old.do_shrink(ctx), store
    except BaseException:
        store.close()
        raise


def _install(st: _state.State, g: Group, members: list[int], dead: list[int], channel: DataChannel,
             store: Store, server: Any) -> Group:
    """Swap the new group in; retire the old handles (closed at destroy_process_group)."""
    dead_world = [g.global_rank(r) for r in dead if 0 <= r < g.size]
    with _state.lock:
        if g is st.world:
            new = Group(range(len(members)), members.index(g.rank), channel, g.spec, 0)
            why = (f"this group was created before shrink() replaced the world "
                   f"(rank(s) {dead_world} died); create it again with new_group()")
            for old in [*st.groups, st.world]:
                held = [r for r in old.ranks if r in dead_world]
                _retire(st, old, why if not held else
                        f"this group held rank(s) {held}, which died; shrink() replaced the world: "
                        f"create the group again with new_group()")
            st.groups = []
            st.local_group, st.local_size = None, None
            st.retired.append(st.store)
            st.store = store
            st.world = new
            _ops.bind_world(new if "cpu" in _state.devices(new) else None)
        else:
            new = Group([g.ranks[m] for m in members], members.index(g.rank), channel, g.spec, g.group_id)
            _retire(st, g, f"shrink() replaced this group (rank(s) {dead_world} died); use the group it returned")
            if "cpu" in _state.devices(new):
                _ops.bind_group(new)
            st.groups.append(new)
            st.retired.append(store)
        if server is not None:
            st.retired.append(server)
    log.info("shrink: %d survivors (dead: %s); this rank is now %d", len(members), dead_world, new.rank)
    return new


def _retire(st: _state.State, g: Group, why: str) -> None:
    for grp in (g.host_group, g):
        if grp is not None and grp.channel is not None:
            st.retired.append(grp.channel)
            grp.channel = None
        if grp is not None:
            grp.retired = why
            grp.fast = None  # the core's fast paths must not bypass member()'s retired check


def _close_quietly(*things: Any) -> None:
    for thing in things:
        try:
            thing.close()
        except Exception:
            log.debug("closing %r failed", thing, exc_info=True)


__all__ = ["agree", "failed_ranks", "revoke", "shrink"]
