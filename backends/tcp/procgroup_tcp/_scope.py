"""Failure scope, as MPI's ULFM defines it: a death fails only what involves the dead rank.

Every group on one tcp transport (the root :class:`~procgroup_tcp.channel.TcpChannel`
and each :class:`~procgroup_tcp.channel.TcpSubChannel` riding on it) has a
:class:`GroupScope`: its members (in the root channel's numbering), the members known
dead, the ones the caller acknowledged (``failure_ack``) and, once revoked, the error.
The root's :class:`Scopes` finds the group a frame's tag belongs to (each group has a tag
space of its own, ``procgroup.backend._context``), so the matcher can ask, for each
receive it posts, whether that group lets it wait:

* a receive from a dead rank fails (PeerError naming it), whatever its group;
* a collective's receive (its tag in a group's collective space) fails when the group
  holds a dead rank: the collective cannot complete without it;
* an any-source receive on a group's user tags fails while the group has a death not
  acknowledged with ``failure_ack``; after it, it hears the live members;
* every receive of a revoked group fails with the revoke's GroupRevokedError.

Everything else (point-to-point between live ranks, groups without the dead rank)
goes on. The same rules decide which posted receives a death or a revoke wakes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from procgroup.backend import COLLECTIVE_TAG_BASE, GROUP_P2P_TAG_BASE, GROUP_TAG_STRIDE, MAX_USER_TAG
from procgroup.errors import PeerError

__all__ = ["GroupScope", "Scopes", "group_of_tag"]


def group_of_tag(tag: int, root_gid: int) -> tuple[int, bool]:
    """(the group id a tag belongs to, whether it is a collective's tag)."""
    if tag < MAX_USER_TAG:
        return root_gid, False
    if tag < GROUP_P2P_TAG_BASE:
        return (tag - COLLECTIVE_TAG_BASE) // GROUP_TAG_STRIDE, True
    return (tag - GROUP_P2P_TAG_BASE) // MAX_USER_TAG, False


class GroupScope:
    """One group's view of failures; ``members``: root rank -> the group's rank."""

    def __init__(self, gid: int, members: dict[int, int], global_rank: Callable[[int], int]) -> None:
        self.gid = gid
        self.members = members
        self._global_rank = global_rank
        #: root rank -> the error its death was reported with, in the order learnt
        self.dead: dict[int, BaseException] = {}
        #: root ranks whose death the caller acknowledged (``failure_ack``)
        self.acked: set[int] = set()
        #: the error a revoke (or a broken arena) failed the whole group with
        self.revoked: BaseException | None = None

    def died(self, root_rank: int, exc: BaseException) -> bool:
        """Record a member's death; False when it is not a member or known already."""
        if root_rank not in self.members or root_rank in self.dead:
            return False
        self.dead[root_rank] = exc
        return True

    def _world(self, root_ranks: Iterable[int]) -> list[int]:
        """World ranks (for errors) of members given in the root's numbering."""
        return sorted(self._global_rank(self.members[r]) for r in root_ranks)

    def collective_error(self) -> BaseException | None:
        """Why a collective of this group cannot run, or None."""
        if self.revoked is not None:
            return self.revoked
        if not self.dead:
            return None
        first = next(iter(self.dead))  # the first death learnt: the later ones may follow from it
        gr = self._world([first])[0]
        dead = [gr] + [r for r in self._world(self.dead) if r != gr]
        cause = self.dead[first]
        # a death recorded as what followed an earlier failure (a departure, a death outside
        # this group) names that one first, as the receives it failed did
        blamed = cause.rank if isinstance(cause, PeerError) and isinstance(cause.rank, int) else gr
        ranks = dead if blamed == gr else [blamed] + dead
        return PeerError(f"a collective of this group cannot complete: rank {gr} of it "
                         f"failed ({cause}); shrink() the group to go on, or use a group without it",
                         rank=blamed, ranks=ranks, departed=blamed != gr and bool(getattr(cause, "departed", False)))

    def any_source_error(self) -> BaseException | None:
        """Why an any-source receive of this group cannot wait, or None."""
        if self.revoked is not None:
            return self.revoked
        unacked = [r for r in self.dead if r not in self.acked]
        if not unacked:
            return None
        who = self._world(unacked)
        return PeerError(f"recv from any rank: rank(s) {who} of this group failed and the failure is not "
                         f"acknowledged; call failure_ack(group) first, then any-source receives hear the "
                         f"live ranks", rank=who[0], ranks=self._world(self.dead))

    def ack(self) -> None:
        """Acknowledge every death known now (ULFM's MPI_Comm_failure_ack)."""
        self.acked = set(self.dead)

    def acked_ranks(self) -> list[int]:
        """The acknowledged dead, in the group's numbering (MPI_Comm_failure_get_acked)."""
        return sorted(self.members[r] for r in self.acked)


class Scopes:
    """The groups on one tcp transport, by group id (held by the root channel)."""

    def __init__(self, root: GroupScope) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._groups: dict[int, GroupScope] = {root.gid: root}
        #: root rank -> the error its death was reported with, in the order learnt
        self.dead: dict[int, BaseException] = {}
        #: something failed (a death, a revoke): the channel's fast paths then ask
        #: :meth:`refusal` before each send and receive; False costs them one read
        self.trouble = False

    def add(self, scope: GroupScope) -> None:
        with self._lock:
            self._groups[scope.gid] = scope
            for rank, exc in self.dead.items():  # a group made after a death knows of it
                scope.died(rank, exc)

    def remove(self, gid: int) -> None:
        with self._lock:
            self._groups.pop(gid, None)

    def get(self, gid: int) -> GroupScope | None:
        return self._groups.get(gid)

    def died(self, root_rank: int, exc: BaseException) -> bool:
        """Record a death in every group that holds it; True the first time."""
        with self._lock:
            if root_rank in self.dead:
                return False
            self.dead[root_rank] = exc
            self.trouble = True
            for scope in self._groups.values():
                scope.died(root_rank, exc)
        return True

    def refusal(self, src: int | None, tag: int) -> BaseException | None:
        """Why a receive from ``src`` (None: any) with ``tag`` may not wait, or None."""
        if self.dead and src is not None and src in self.dead:
            return self.dead[src]
        gid, collective = group_of_tag(tag, self.root.gid)
        scope = self._groups.get(gid)
        if scope is None:
            return None
        if collective:
            return scope.collective_error()
        if scope.revoked is not None:
            return scope.revoked
        return scope.any_source_error() if src is None else None

    def involves(self, src: int | None, tag: int, rank: int) -> bool:
        """A waiting receive that the death of ``rank`` fails (see the module)."""
        if src == rank:
            return True
        gid, collective = group_of_tag(tag, self.root.gid)
        scope = self._groups.get(gid)
        if scope is None or rank not in scope.members:
            return False
        return collective or src is None

    def of_group(self, gid: int) -> Callable[[int | None, int], bool]:
        """A test for the receives of group ``gid`` (a revoke fails them all)."""
        root_gid = self.root.gid

        def test(src: int | None, tag: int) -> bool:
            return group_of_tag(tag, root_gid)[0] == gid

        return test
