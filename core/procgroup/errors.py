"""The exception hierarchy of procgroup.

Every error procgroup raises on purpose derives from :class:`ProcGroupError`, and also
from the builtin that fits (ValueError, TypeError, TimeoutError, ...), so callers can
catch either the specific procgroup class or the generic Python one.
"""

from __future__ import annotations

from collections.abc import Iterable


class ProcGroupError(Exception):
    """Base class of every error procgroup raises on purpose."""

    #: with PROCGROUP_UNIFORM_FAILURE=1: the number (from 0) on its group of the collective
    #: that failed, the same on every survivor; None otherwise
    seq: int | None = None


class NotInitializedError(ProcGroupError, RuntimeError):
    """A call needs ``init_process_group`` first (or the group was destroyed)."""


class AlreadyInitializedError(ProcGroupError, RuntimeError):
    """``init_process_group`` was called twice without ``destroy_process_group``."""


class InvalidArgumentError(ProcGroupError, ValueError):
    """An argument or environment variable has a bad value; the message names it."""


class InvalidArrayError(ProcGroupError, TypeError):
    """An array cannot be used: wrong type, not contiguous, read-only, wrong dtype/shape."""


class UnsupportedOperationError(ProcGroupError, NotImplementedError):
    """The backend cannot do this op on this device or dtype; the message names all three."""


class BackendNotFoundError(ProcGroupError, ValueError):
    """No installed backend has the requested name; the message lists the installed ones."""


class BackendUnavailableError(ProcGroupError, RuntimeError):
    """The backend is installed but cannot run here (no GPU, missing library, ...)."""


class PluginError(ProcGroupError, RuntimeError):
    """A plugin is malformed, or two plugins claim one backend name."""


class RendezvousError(ProcGroupError, RuntimeError):
    """The init method could not bring the ranks together."""


class StoreError(ProcGroupError, RuntimeError):
    """A key-value Store operation failed (connection lost, bad reply, ...)."""


class CommTimeoutError(ProcGroupError, TimeoutError):
    """A blocking call ran past its timeout; the message names the op and the missing ranks."""

    def __init__(self, message: str, *, op: str = "", ranks: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.op = op
        self.ranks = tuple(ranks)


class StoreTimeoutError(CommTimeoutError):
    """Waiting for Store keys ran past the timeout; the message names the keys."""


class PeerError(ProcGroupError, ConnectionError):
    """A peer rank died, closed its connection or reported a failure.

    ``rank`` is the first rank blamed (None when unknown): when the failure follows from an
    earlier death or departure, that one (the first failure wins). ``ranks`` are the ranks
    involved, in the numbering of the channel that saw it: every rank known dead when the
    error was raised, or the first failure and the rank lost or gone after it.
    ``departed`` is True when the blamed rank said goodbye (it left on purpose, maybe
    because of an earlier failure it reports) rather than vanishing.
    """

    def __init__(self, message: str, *, rank: int | None = None, ranks: Iterable[int] = (),
                 departed: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        self.departed = departed
        found = tuple(ranks)
        self.ranks = found if found else (() if rank is None else (rank,))


class GroupRevokedError(ProcGroupError, RuntimeError):
    """The group was revoked (``revoke``, by this or another member), or replaced by
    ``shrink``: its ops fail until the survivors shrink it. ``ranks`` names the members
    known dead, when any are."""

    def __init__(self, message: str, *, ranks: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


class ChannelClosedError(ProcGroupError, RuntimeError):
    """The DataChannel was closed (destroy_process_group) while the call was pending."""


class WorkCancelledError(ProcGroupError, RuntimeError):
    """The receive was withdrawn with ``Work.cancel()`` before any message matched it."""


class AuthenticationError(ProcGroupError, PermissionError):
    """The peer did not prove it holds the job's token (PROCGROUP_JOB_TOKEN), or this
    process does not hold the token of the job it tried to join."""


class MismatchError(ProcGroupError, RuntimeError):
    """Ranks called different ops, or the same op with different sizes, dtypes, roots or
    reduce ops; the message names the ranks and both sides."""

    def __init__(self, message: str, *, ranks: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)


class RemoteError(ProcGroupError, RuntimeError):
    """An operation failed on a master-worker node; raised on the master at the next sync
    point that depends on it. ``node``, ``rank``, ``op``, ``exc_type`` and the worker's
    ``remote_traceback`` say what failed where; ``errors`` lists every failure reported."""

    def __init__(self, message: str, *, node: int = -1, rank: int = -1, op: str = "", exc_type: str = "",
                 remote_traceback: str = "", errors: Iterable[tuple[object, ...]] = ()) -> None:
        super().__init__(message)
        self.node = node
        self.rank = rank
        self.op = op
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.errors = list(errors)


__all__ = [
    "AlreadyInitializedError",
    "AuthenticationError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "ChannelClosedError",
    "CommTimeoutError",
    "GroupRevokedError",
    "InvalidArgumentError",
    "InvalidArrayError",
    "MismatchError",
    "NotInitializedError",
    "PeerError",
    "PluginError",
    "ProcGroupError",
    "RemoteError",
    "RendezvousError",
    "StoreError",
    "StoreTimeoutError",
    "UnsupportedOperationError",
    "WorkCancelledError",
]
