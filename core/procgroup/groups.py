"""Group handles, rank translation, and the default sub-channel for new_group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from .channel import MAX_USER_TAG, ChannelContext, DataChannel, Work
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


#: User tags of a group's point-to-point calls move here, one 2**31 window per group.
_GROUP_P2P_TAG_BASE = 2**62


class SubChannel(DataChannel):
    """A group's channel that rides on its parent's transport.

    Ranks are translated to the parent's. The group's collectives get their own tag space
    from ``ctx.group_id``, and so do its users' tags, so traffic of different groups
    never mixes on shared sockets and an any-source receive only hears members.
    """

    def __init__(self, parent: DataChannel, ranks: Sequence[int], ctx: ChannelContext) -> None:
        self.backend_name = parent.backend_name
        super().__init__(ctx)
        self._parent = parent
        self._ranks = tuple(ranks)
        self._index = {r: i for i, r in enumerate(self._ranks)}
        self._user_tag_base = _GROUP_P2P_TAG_BASE + ctx.group_id * MAX_USER_TAG

    def _tag(self, tag: int) -> int:
        return tag if tag >= MAX_USER_TAG else self._user_tag_base + tag

    def send(self, array: Any, dst: int, tag: int = 0) -> None:
        self._parent.send(array, self._ranks[dst], self._tag(tag))

    def recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        sender = self._parent.recv(array, None if src is None else self._ranks[src], self._tag(tag))
        return self._index[sender]

    def isend(self, array: Any, dst: int, tag: int = 0) -> Work:
        return self._parent.isend(array, self._ranks[dst], self._tag(tag))

    def irecv(self, array: Any, src: int | None = None, tag: int = 0) -> Work:
        work = self._parent.irecv(array, None if src is None else self._ranks[src], self._tag(tag))
        return _TranslatedWork(work, self._index)

    def close(self) -> None:
        self._closed = True
        self.shutdown_threads()


class _TranslatedWork(Work):
    """The parent's irecv Work, with the sender reported as a group rank."""

    def __init__(self, inner: Work, index: dict[int, int]) -> None:
        self.op = inner.op
        self._inner = inner
        self._index = index

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def wait(self, timeout: float | None = None) -> bool:
        return self._inner.wait(timeout)

    def exception(self) -> BaseException | None:
        return self._inner.exception()

    def result(self) -> Any:
        sender = self._inner.result()
        return None if sender is None else self._index[sender]


__all__ = ["Group", "GroupMember", "SubChannel", "group"]
