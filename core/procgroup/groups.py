"""Group handles and the translation between world and group ranks."""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

from .backend import BackendSpec, DataChannel
from .errors import InvalidArgumentError


class Group:
    """A set of world ranks that run collectives together over one DataChannel.

    ``rank`` is this process's rank inside the group, -1 when it is not a member (then
    ``channel`` is None and every op on the group raises a clear error).
    """

    def __init__(self, ranks: Sequence[int], rank: int, channel: DataChannel | None,
                 spec: BackendSpec, group_id: int) -> None:
        self.ranks = tuple(ranks)
        self.rank = rank
        self.channel = channel
        self.spec = spec
        self.group_id = group_id
        self._index = {r: i for i, r in enumerate(self.ranks)}
        self.host_group: Group | None = None  # CPU side group for object collectives
        self.fast: Any = None  # the core's fast paths (_ops.FastPath) while the channel is open
        #: why the handle no longer works, once shrink() replaced it ("" while it does)
        self.retired = ""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def backend(self) -> str:
        return self.spec.name

    @property
    def is_member(self) -> bool:
        return self.rank >= 0

    def group_rank(self, global_rank: int, what: str) -> int:
        """Translate a world rank given as ``what`` (e.g. "src") to a rank in this group."""
        if isinstance(global_rank, bool) or not isinstance(global_rank, int):
            raise InvalidArgumentError(f"{what} must be an int rank, got {global_rank!r}")
        try:
            return self._index[global_rank]
        except KeyError:
            raise InvalidArgumentError(
                f"{what}={global_rank} is not a rank of this group (its world ranks are {list(self.ranks)})"
            ) from None

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]

    def __repr__(self) -> str:
        who = f"rank {self.rank}" if self.is_member else "not a member"
        return f"<procgroup.Group {self.group_id} backend={self.backend} ranks={list(self.ranks)} ({who})>"


#: What an op's ``group=`` takes: a Group; None or ``group.WORLD`` for the default group; or
#: the 2017 module's group id (an int: 0 is the world, n the n-th new_group).
GroupArg = Group | int | None


class _GroupNamespace:
    """``procgroup.group.WORLD``: the default group, resolved at call time."""

    class _World:
        def __repr__(self) -> str:
            return "procgroup.group.WORLD"

    WORLD: Any = _World()


group = _GroupNamespace()


class GroupMember:
    """torch.distributed's name for the default group."""

    WORLD = group.WORLD


__all__ = ["Group", "GroupArg", "GroupMember", "group"]
