"""Uniform failure: a collective fails on every survivor or on none (opt-in).

By default the collective in flight when a rank dies may complete on a survivor that
already had every contribution and fail on another, which then fails at its next op
(ULFM's rule; docs/fault-tolerance.md). ``PROCGROUP_UNIFORM_FAILURE=1`` (or the channel
option ``uniform_failure``) ends every collective with the survivors' agreement
(:mod:`._survival`): the AND of "it completed here", the same on every survivor even
when a member dies during the agreement. When it is False every survivor raises for that
collective, whose number on the group (``error.seq``, counted from 0) is the same
everywhere, and its output arrays hold no valid result. The price is one agreement per
collective, a few small control messages whether or not anyone dies; so it is off by
default, and async collectives complete before the call returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from collections.abc import Mapping

from .._settings import env_flag
from ..errors import PeerError, ProcGroupError, UnsupportedOperationError

if TYPE_CHECKING:
    from ._channel import DataChannel

ENV_UNIFORM = "PROCGROUP_UNIFORM_FAILURE"


def wanted(options: Mapping[str, Any] | None) -> bool:
    """Option ``uniform_failure``, else $PROCGROUP_UNIFORM_FAILURE, else off."""
    return env_flag(ENV_UNIFORM, False, name="uniform_failure", options=options)


def refusal(channel: DataChannel | type[DataChannel]) -> UnsupportedOperationError:
    """Why a channel (or channel class) without a control plane cannot fail uniformly."""
    why = channel.shrink_unsupported if not isinstance(channel, type) else ""
    if not why:
        why = (f"the {channel.backend_name or getattr(channel, '__name__', type(channel).__name__)} backend "
               f"cannot agree after a death: it has no control plane (DataChannel.do_control_send; "
               f"docs/fault-tolerance.md, docs/plugins.md)")
    return UnsupportedOperationError(f"{ENV_UNIFORM}=1 needs the survivors' agreement after every collective: {why}")


def run(channel: DataChannel, op: str, args: tuple[Any, ...]) -> None:
    """Run collective ``op`` to completion, then agree with the other survivors whether it
    completed everywhere; raise on every survivor when it did not."""
    seq = channel.uniform_seq
    channel.uniform_seq = seq + 1
    where = f"collective #{seq} of this group"
    error: ProcGroupError | None = None
    try:
        channel.run(op, *args)
    except ProcGroupError as exc:
        error = exc
    try:
        decision = channel.agree(error is None, channel.timeout)
    except ProcGroupError as exc:  # no agreement (this rank counted dead, a timeout)
        raise _numbered(error or exc, seq, f"{where}; the survivors' agreement on it failed: {exc}"
                        if error is not None else where) from None
    if decision.value:
        return
    if error is None:
        dead = sorted(channel.ctx.global_rank(r) for r in decision.dead)
        cause = f"rank(s) {dead} died" if dead else "it failed there"
        message = (f"{where} completed here but not on every survivor ({cause}); every survivor fails it, "
                   f"and the arrays it wrote here hold no valid result")
        error = PeerError(message, ranks=dead) if dead else ProcGroupError(message)
    raise _numbered(error, seq, f"{where}; it failed on every survivor")


def _numbered(exc: ProcGroupError, seq: int, note: str) -> ProcGroupError:
    """``exc`` with the collective's number on the group (``seq``), and ``note`` in its message."""
    exc.seq = seq
    if exc.args and isinstance(exc.args[0], str) and note not in exc.args[0]:
        exc.args = (f"{exc.args[0]} [{note}]",) + exc.args[1:]
    return exc


__all__ = ["ENV_UNIFORM", "refusal", "run", "wanted"]
