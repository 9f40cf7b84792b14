"""What only MPI needs around its requests: error translation, parking, cancelling.

A request still pending when nobody waits on it any more (an op that timed out or was
interrupted, a Work dropped before it completed) is not freed: MPI cannot cancel
collectives or, portably, sends, and may still write into the op's buffers. :func:`park`
keeps such requests and their buffers alive, module-wide (they outlive the channel),
until MPI is done. Receives are the exception: ``MPI_Cancel`` is reliable for them, and a
receive left posted would swallow a later message, so :func:`cancel_recv` ends them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpi4py import MPI
from procgroup.backend import poll
from procgroup.errors import InvalidArgumentError, InvalidArrayError, PeerError

#: MPI error classes that mean the call itself was wrong, not that a peer or link failed.
_ARGUMENT_ERRORS = frozenset(
    getattr(MPI, name) for name in (
        "ERR_BUFFER", "ERR_COUNT", "ERR_TYPE", "ERR_TAG", "ERR_RANK", "ERR_ROOT", "ERR_GROUP",
        "ERR_OP", "ERR_ARG", "ERR_DIMS",
    ) if hasattr(MPI, name)
)


def translate(exc: BaseException, what: str) -> BaseException:
    """A procgroup error for an ``MPI.Exception`` (truncation -> InvalidArrayError)."""
    if not isinstance(exc, MPI.Exception):
        return exc
    cls = exc.Get_error_class()
    text = exc.Get_error_string().strip()
    if cls == MPI.ERR_TRUNCATE:
        return InvalidArrayError(
            f"{what}: the message is larger than the receive buffer ({text}); sizes must match"
        )
    if cls in _ARGUMENT_ERRORS:
        return InvalidArgumentError(f"{what}: MPI rejected the arguments (error class {cls}): {text}")
    return PeerError(f"{what}: MPI error class {cls}: {text}")


def requests_done(requests: Sequence[Any]) -> bool:
    """True when MPI is finished with every request (an error counts as finished)."""
    try:
        return bool(MPI.Request.Testall(requests))
    except MPI.Exception:
        return True


#: (requests, buffers) that MPI may still use but nobody waits on any more.
_orphans: list[tuple[list[Any], Any]] = []


def park(requests: Sequence[Any], keep: Any) -> None:
    """Keep unfinished ``requests`` and the buffers they use alive until MPI is done."""
    if not requests_done(requests):
        _orphans[:] = [(r, k) for r, k in _orphans if not requests_done(r)]
        _orphans.append((list(requests), keep))


def cancel_recv(request: Any, status: Any) -> bool:
    """Cancel a pending receive; False when a message matched it first (it is then complete)."""
    request.Cancel()
    request.Wait(status)
    return bool(status.Is_cancelled())


def wait_all(requests: Sequence[Any], timeout: float, what: str, op: str, keep: Any = None) -> None:
    """Poll ``requests`` until all complete (setup steps, not ops: those are MpiWorks);
    CommTimeoutError naming ``what`` after ``timeout``. On any early exit the requests
    and ``keep`` (buffers MPI may still write) are parked."""
    testall = MPI.Request.Testall
    try:
        poll(lambda: testall(requests), timeout, what=what, op=op)
    except MPI.Exception as exc:
        raise translate(exc, what) from None
    except BaseException:
        park(requests, keep)
        raise


__all__ = ["cancel_recv", "park", "requests_done", "translate", "wait_all"]
