"""procgroup.backend: the public SDK every backend is built on.

A backend is a :class:`DataChannel` subclass that implements each op once, as
``do_<op>`` (runs on the caller's thread) or ``start_<op>`` (returns a :class:`Work`),
plus a plugin module whose ``procgroup_backends`` hook returns a :class:`BackendSpec`.
The rest is here so that no backend writes it again: the Work handles, the generic
collectives, :class:`SubChannel` for groups, reduction lowering tables
(:class:`ReduceTable`), one wait (:func:`poll`), settings parsing, the broken/closed
state (:meth:`DataChannel.fail`, :meth:`DataChannel.check_usable`), and the interface
picker (:func:`choose_address`), and the job-token handshake every connection starts
with (:func:`client_handshake` / :func:`server_handshake` on ``ctx.job_key``). docs/plugins.md walks through writing one.

Backends import this package, ``procgroup.errors``, ``procgroup.ops``,
``procgroup.arrays``, ``procgroup.rendezvous`` and ``procgroup.algorithms``, and
nothing private.
"""

from .._auth import client_handshake, job_key, recv_exact, server_handshake
from .._settings import (
    MAX_TIMEOUT_S,
    env_bytes,
    env_choice,
    env_count,
    env_flag,
    env_timeout,
    setting,
    timeout_seconds,
)
from ._channel import DataChannel, SubChannel, fresh, implemented_ops
from ._context import (
    ALL_OPS,
    COLLECTIVE_TAG_BASE,
    COLLECTIVES,
    GROUP_P2P_TAG_BASE,
    GROUP_TAG_STRIDE,
    MAX_USER_TAG,
    OPS,
    POINT_TO_POINT,
    ChannelContext,
)
from ._fingerprint import Fingerprint, mismatch
from ._lowering import Lowered, ReduceTable, flat_view
from .._netif import ENV_SOCKET_IFNAME, choose_address
from ._spec import BackendSpec, InitMethodSpec, hookimpl
from ._survival import MAX_CONTROL_BYTES, Decision
from ._wait import late_peers, poll
from ._work import CompletedWork, FutureWork, MappedWork, OrderedExecutor, Work


def host_address(ctx: ChannelContext) -> str:
    """The address a socket-based channel of ``ctx`` binds and publishes to its peers."""
    ifname = ctx.options.get("ifname")
    return choose_address(ctx.master_addr, None if ifname is None else str(ifname))


__all__ = [
    "ALL_OPS",
    "COLLECTIVES",
    "COLLECTIVE_TAG_BASE",
    "ENV_SOCKET_IFNAME",
    "GROUP_P2P_TAG_BASE",
    "GROUP_TAG_STRIDE",
    "MAX_CONTROL_BYTES",
    "MAX_TIMEOUT_S",
    "MAX_USER_TAG",
    "OPS",
    "POINT_TO_POINT",
    "BackendSpec",
    "ChannelContext",
    "CompletedWork",
    "DataChannel",
    "Decision",
    "Fingerprint",
    "FutureWork",
    "InitMethodSpec",
    "Lowered",
    "MappedWork",
    "OrderedExecutor",
    "ReduceTable",
    "SubChannel",
    "Work",
    "choose_address",
    "client_handshake",
    "env_bytes",
    "env_choice",
    "env_count",
    "env_flag",
    "env_timeout",
    "flat_view",
    "fresh",
    "hookimpl",
    "host_address",
    "implemented_ops",
    "job_key",
    "late_peers",
    "mismatch",
    "poll",
    "recv_exact",
    "server_handshake",
    "setting",
    "timeout_seconds",
]
