"""Group handles, rank translation, and the default sub-channel for new_group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .channel import ChannelContext, DataChannel, Work
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .hookspecs import BackendSpec


class Group:
    """A set of world ranks that run collectives together over one DataChannel.

    ``rank`` is this process's rank inside the group, -1 when it is not a member (then
    ``channel`` is None and every op on the group raises a clear error).
    """

    def __init__(self, ranks: Sequence[int], rank: int, channel: DataChannel | None,
                 spec: "BackendSpec", group_id: int) -> None:
        self.ranks = tuple(ranks)
        self.rank = rank
        self.channel = channel
        self.spec = spec
        self.group_id = group_id
        self._index = {r: i for i, r in enumerate(self.ranks)}
        self.host_group: Group | None = None  # CPU side group for object collectives

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


class _GroupNamespace:
    """``procgroup.group.WORLD``: the default group, resolved at call time."""

    class _World:
        def __repr__(self) -> str:
            return "procgroup.group.WORLD"

    WORLD: Any = _World()


group = _GroupNamespace()


class GroupMember:
    """torch.distributed's names for the default group and for a non-member."""

    WORLD = group.WORLD
    NON_GROUP_MEMBER = object()


class SubChannel(DataChannel):
    """A group's channel that rides on its parent's transport.

    Ranks are translated to the parent's; the group's collectives get their own tag space
    from ``ctx.group_id``, so traffic of different groups never mixes on shared sockets.
    """

    def __init__(self, parent: DataChannel, ranks: Sequence[int], ctx: ChannelContext) -> None:
        self.backend_name = parent.backend_name
        super().__init__(ctx)
        self._parent = parent
        self._ranks = tuple(ranks)
        self._index = {r: i for i, r in enumerate(self._ranks)}

    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        self._parent.send(array, self._ranks[dst], tag)

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        sender = self._parent.recv(array, None if src is None else self._ranks[src], tag)
        return self._index[sender]

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        return self._parent.isend(array, self._ranks[dst], tag)

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        if src is None:
            return super().irecv(array, None, tag)  # translate the sender on our thread
        return self._parent.irecv(array, self._ranks[src], tag)

    def close(self) -> None:
        self._closed = True
        self.shutdown_threads()


__all__ = ["Group", "GroupMember", "SubChannel", "group"]
