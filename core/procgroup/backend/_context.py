"""What a channel is given at construction, and the names and tag spaces of the ops."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

if TYPE_CHECKING:
    from ..rendezvous import Store
    from ._channel import DataChannel

#: User tags must stay below this; collectives and groups use the space above.
MAX_USER_TAG = 2**31
#: Tags of the collectives built on point-to-point start here (one window per group).
COLLECTIVE_TAG_BASE = 2**40
GROUP_TAG_STRIDE = 2**24
#: User tags of a group's point-to-point calls move here, one 2**31 window per group.
GROUP_P2P_TAG_BASE = 2**62

#: Every collective a DataChannel offers; the capability table iterates over these.
COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)
#: The point-to-point ops a backend implements (isend/irecv are their started form).
POINT_TO_POINT = ("send", "recv")
#: Every op a backend may implement, as ``do_<op>`` or ``start_<op>``.
OPS = POINT_TO_POINT + COLLECTIVES
#: The ops of the public API, for the capability table.
ALL_OPS = ("send", "recv", "isend", "irecv") + COLLECTIVES


@dataclass(frozen=True)
class ChannelContext:
    """Who this rank is, who the peers are, how to meet them, and the backend's options."""

    rank: int
    size: int
    store: Store  # a PrefixStore private to this channel
    timeout: float  # seconds; every blocking call of the channel honours it
    master_addr: str | None = None  # where rank 0 of the world is reached (interface choice)
    global_ranks: tuple[int, ...] = ()  # world rank of each channel rank, for messages
    group_id: int = 0  # 0 for the world; distinct per group, the same on every member
    #: Backend options from init_process_group(options=...) / new_group(options=...).
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Opens a host (CPU) point-to-point channel over the same members: the best
    #: installed side-channel backend, picked by the core's registry. A backend whose
    #: own transport cannot do what it needs (gloo's p2p) uses it.
    open_side_channel: Callable[[ChannelContext], DataChannel] | None = None
    #: The job's HMAC key (from the job token): every connection the channel opens starts
    #: with client_handshake/server_handshake on it. None: the key of "no token".
    job_key: bytes | None = None
    #: Set-up waits call it often; it raises to abandon the set-up (shrink: a member of
    #: the new channel died meanwhile). None outside shrink.
    abort: Callable[[], None] | None = None

    def global_rank(self, rank: int) -> int:
        """The world rank of channel rank ``rank`` (for error messages)."""
        return self.global_ranks[rank] if self.global_ranks else rank

    def channel_rank(self, global_rank: int, what: str = "rank") -> int:
        """The channel rank of world rank ``global_rank`` (given as ``what``, e.g. "src")."""
        from ..errors import InvalidArgumentError

        world = self.global_ranks or tuple(range(self.size))
        if isinstance(global_rank, bool) or not isinstance(global_rank, int) or global_rank not in world:
            raise InvalidArgumentError(
                f"{what}={global_rank!r} is not a rank of this group (its world ranks are {list(world)})")
        return world.index(global_rank)


__all__ = [
    "ALL_OPS",
    "COLLECTIVES",
    "COLLECTIVE_TAG_BASE",
    "ChannelContext",
    "GROUP_P2P_TAG_BASE",
    "GROUP_TAG_STRIDE",
    "MAX_USER_TAG",
    "OPS",
    "POINT_TO_POINT",
]
