"""Which ranks of a tcp channel share a host, learnt once per channel.

The host identity of every rank is already in the channel's Store: the shared-memory
point-to-point set-up (``_p2p._local_candidates``) publishes each rank's
``host_identity()`` there at init, under ``P2P_HOST_KEY``, whether or not shared memory
is then used. The topology reads those keys (no exchange of its own) the first time a
collective of the channel needs it; a sub-channel derives its own from its parent's
through its rank list. PROCGROUP_TCP_TWO_LEVEL=0 (or the channel option
``two_level=False``) keeps every collective flat.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from procgroup.algorithms.hierarchical import Topology
from procgroup.backend import ChannelContext, env_flag

__all__ = ["ENV_TWO_LEVEL", "P2P_HOST_KEY", "channel_topology", "two_level_wanted"]

log = logging.getLogger(__name__)

#: PROCGROUP_TCP_TWO_LEVEL=0 (option ``two_level=False``): flat collectives on any topology.
ENV_TWO_LEVEL = "PROCGROUP_TCP_TWO_LEVEL"
#: The Store key under which ``_p2p`` publishes each rank's "<host identity>|<p2p wanted>".
P2P_HOST_KEY = "tcp/p2p/host/{rank}"


def two_level_wanted(options: Mapping[str, Any] | None) -> bool:
    return env_flag(ENV_TWO_LEVEL, True, name="two_level", options=options)


def host_labels(ctx: ChannelContext) -> list[str]:
    """Collective in effect (every rank published its key at init): each rank's host."""
    labels = []
    for r in range(ctx.size):
        raw = ctx.store.get(P2P_HOST_KEY.format(rank=r), timeout=ctx.timeout).decode("utf-8", "replace")
        labels.append(raw.rpartition("|")[0] or raw)  # drop the "p2p wanted" flag
    return labels


def channel_topology(channel: Any) -> Topology:
    """The topology of a TcpChannel (from its Store) or TcpSubChannel (its parent's,
    through the rank list), cached on the channel."""
    topo: Topology | None = getattr(channel, "_topology_cache", None)
    if topo is not None:
        return topo
    parent = getattr(channel, "_parent", None)
    if parent is not None:
        topo = channel_topology(parent).subset(channel._ranks)
    else:
        topo = Topology.from_labels(host_labels(channel.ctx)) if channel.size > 1 else Topology(((0,),), (0,))
    channel._topology_cache = topo
    log.debug("procgroup tcp: group %d spans %s hosts x ranks (%s)", channel.ctx.group_id, topo.shape(),
              "two levels" if topo.two_level else "flat")
    return topo
