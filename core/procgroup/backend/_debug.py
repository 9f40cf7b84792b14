"""PROCGROUP_DEBUG: ranks agree on every collective, checked before it runs.

MPI, gloo and NCCL trust the caller: ranks that call different collectives (or the same
one with different sizes, dtypes, roots or reduce ops) hang, abort the job or get wrong
data. With ``PROCGROUP_DEBUG=DETAIL`` (like ``TORCH_DISTRIBUTED_DEBUG``) every rank of a
channel whose transport cannot check (``DataChannel.checks_agreement`` False) exchanges
the op's 32-byte :class:`Fingerprint` with every other rank before the collective, and
any disagreement is a :class:`~procgroup.errors.MismatchError` on every rank, naming
this rank, the first rank that disagrees and what each called. Nothing was started, so
the group stays usable.

The exchange runs on the channel's own point-to-point when it moves host arrays, else on
a host side channel (``ctx.open_side_channel``, opened by the first check), with tags of
its own (:data:`DEBUG_TAG_BASE`) and the channel's timeout. ``INFO`` logs which channels
would be checked; ``OFF`` (the default) costs one attribute test per call.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

import numpy as np

from .._settings import env_choice
from ..errors import BackendNotFoundError, CommTimeoutError
from ._fingerprint import NO_ROOT, SIZE, Fingerprint, mismatch
from ._wait import late_peers

if TYPE_CHECKING:
    from ._channel import DataChannel

log = logging.getLogger(__name__)

ENV_DEBUG = "PROCGROUP_DEBUG"
LEVELS = ("off", "info", "detail")
#: Tags of the fingerprint exchange: far above user tags (< 2**31), the collectives'
#: windows (2**40 + group * 2**24) and below groups' user tags (2**62); one window of
#: 2**24 per group, so groups sharing a transport (SubChannel) never mix.
DEBUG_TAG_BASE = 2**61
_WINDOW = 2**24

#: op -> (index of the array that describes it, index of the root, index of the reduce op)
_ARGS: dict[str, tuple[int | None, int | None, int | None]] = {
    "broadcast": (0, 1, None),
    "all_reduce": (0, None, 1),
    "reduce": (0, 1, 2),
    "all_gather": (1, None, None),
    "gather": (0, 2, None),
    "scatter": (0, 2, None),
    "reduce_scatter": (0, None, 2),
    "all_to_all": (1, None, None),
    "barrier": (None, None, None),
}


def level(options: Mapping[str, Any] | None = None) -> str:
    """off, info or detail: option ``debug``, else $PROCGROUP_DEBUG, else off."""
    return env_choice(ENV_DEBUG, LEVELS, "off", name="debug", options=options)


def for_channel(channel: DataChannel) -> Agreement | None:
    """The checker of a new channel, or None when nothing is to be checked (the default)."""
    mode = level(channel.ctx.options)
    if mode == "off":
        return None
    name = channel.backend_name or type(channel).__name__
    if channel.checks_agreement:
        log.info("procgroup debug: %s group %d: the transport checks that ranks agree on every op",
                 name, channel.ctx.group_id)
        return None
    if mode == "info" or channel.size == 1:
        log.info("procgroup debug: %s group %d: collectives %s", name, channel.ctx.group_id,
                 "need no check (one rank)" if channel.size == 1
                 else f"are not checked; {ENV_DEBUG}=DETAIL checks them")
        return None
    log.info("procgroup debug: %s group %d: every collective is checked (%s=DETAIL)",
             name, channel.ctx.group_id, ENV_DEBUG)
    return Agreement(channel)


def _shape(x: Any) -> tuple[str, int]:
    """(dtype char, bytes) of an array, or of a list of arrays (first dtype, total bytes)."""
    if hasattr(x, "dtype") and hasattr(x, "nbytes"):
        return np.dtype(x.dtype).char, int(x.nbytes)
    if isinstance(x, (list, tuple)) and x:
        return _shape(x[0])[0], sum(_shape(a)[1] for a in x)
    return "B", 0


def fingerprint(channel: DataChannel, op: str, seq: int, args: tuple[Any, ...]) -> Fingerprint:
    """What this rank is about to run: ``op`` on ``args`` (as the channel takes them).
    Roots are given as world ranks, as the user passed them."""
    array_at, root_at, reduce_at = _ARGS.get(op, (None, None, None))
    dtype, nbytes = _shape(args[array_at]) if array_at is not None and array_at < len(args) else ("B", 0)
    root = NO_ROOT
    if root_at is not None and root_at < len(args) and isinstance(args[root_at], int):
        root = args[root_at]
        if 0 <= root < channel.size:
            root = channel.ctx.global_rank(root)
    reduce_op = args[reduce_at] if reduce_at is not None and reduce_at < len(args) else None
    return Fingerprint(op, seq, dtype, nbytes, root, reduce_op)


class Agreement:
    """The fingerprint exchange of one channel (ops on it are issued in one order)."""

    def __init__(self, channel: DataChannel) -> None:
        self._channel = channel
        self._seq = 0
        self._p2p: DataChannel | None = None
        self._own: DataChannel | None = None  # a side channel opened here, closed with the channel
        self._tags = DEBUG_TAG_BASE + (channel.ctx.group_id % (2**37)) * _WINDOW

    def checked(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (the blocking form of ``op``) preceded by the check."""
        check = self.check

        def checked_op(*args: Any) -> Any:
            check(op, args)
            return fn(*args)

        return checked_op

    def check(self, op: str, args: tuple[Any, ...]) -> None:
        """Return once every rank called the same ``op``; MismatchError otherwise."""
        ch = self._channel
        ch.check_usable()
        seq = self._seq
        self._seq += 1
        mine = fingerprint(ch, op, seq, args)
        rows = np.zeros((ch.size, SIZE), dtype=np.uint8)
        rows[ch.rank] = np.frombuffer(mine.pack(), dtype=np.uint8)
        self._exchange(rows, self._tags + seq % _WINDOW, mine)
        me = rows[ch.rank]
        for peer in range(ch.size):
            if peer != ch.rank and not np.array_equal(rows[peer], me):
                theirs = Fingerprint.unpack(rows[peer].tobytes())
                raise mismatch(mine, theirs, ch.ctx.global_rank(ch.rank), ch.ctx.global_rank(peer))

    def _exchange(self, rows: np.ndarray, tag: int, mine: Fingerprint) -> None:
        """rows[r] becomes rank r's fingerprint, on every rank (everyone sends to everyone:
        one round trip of latency)."""
        ch = self._channel
        p2p = self._p2p if self._p2p is not None else self._open()
        peers = [r for r in range(ch.size) if r != ch.rank]
        recvs = [(peer, p2p.irecv(rows[peer], peer, tag)) for peer in peers]
        sends = [(peer, p2p.isend(rows[ch.rank], peer, tag)) for peer in peers]
        missing = [ch.ctx.global_rank(peer) for peer in late_peers(recvs + sends, ch.timeout)]
        if missing:
            who = ", ".join(f"rank {r}" for r in missing)
            raise CommTimeoutError(
                f"{ENV_DEBUG}=DETAIL: {who} did not reach a collective within {ch.timeout:g}s while rank "
                f"{ch.ctx.global_rank(ch.rank)} waited to check {mine.describe()} (a rank that called a "
                f"different op, send/recv, or nothing)", op=mine.op, ranks=missing)

    def _open(self) -> DataChannel:
        """The channel's own point-to-point when it moves host arrays, else a host side channel."""
        ch = self._channel
        devices = ch.devices
        if devices is None or "cpu" in devices:
            self._p2p = ch
            return ch
        ctx = ch.ctx
        if ctx.open_side_channel is None:
            raise BackendNotFoundError(
                f"{ENV_DEBUG}=DETAIL on backend {ch.backend_name!r} needs a host side channel, and none is "
                f"installed (pip install procgroup-tcp), or unset {ENV_DEBUG}")
        from ..rendezvous import PrefixStore

        side = ctx.open_side_channel(dataclasses.replace(ctx, store=PrefixStore("debug/", ctx.store)))
        self._p2p = self._own = side
        return side

    def close(self) -> None:
        """Close the side channel this checker opened, if any."""
        own, self._own, self._p2p = self._own, None, None
        if own is not None:
            own.close()


__all__ = ["DEBUG_TAG_BASE", "ENV_DEBUG", "LEVELS", "Agreement", "fingerprint", "for_channel", "level"]
