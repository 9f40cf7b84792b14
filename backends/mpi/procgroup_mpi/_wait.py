"""Waiting on MPI requests with a deadline, and the Work handle that wraps them.

MPI's blocking calls cannot time out, so every op of this backend is the nonblocking
MPI call followed by :func:`wait_requests`, which polls ``Test`` until the request
completes or the deadline passes. Polling is what MPI's own blocking calls do inside
(busy progress); the cost of doing it from Python was measured (docs/backends/mpi.md):
an 8-byte Iallreduce + Test loop is as fast as a blocking Allreduce.

The poll has three phases, so short ops see no added latency and long waits (a peer
that is late to a collective) do not starve an oversubscribed machine:

1. spin on ``Test`` for :data:`SPIN_S`;
2. ``Test`` + ``os.sched_yield()`` until :data:`YIELD_S` (lets a co-located rank run);
3. ``Test`` + ``time.sleep`` growing from :data:`SLEEP_MIN_S` to :data:`SLEEP_MAX_S`.

A request still pending at the deadline is not freed (MPI cannot cancel collectives or,
portably, sends): it stays referenced by the channel so its buffers stay alive, and the
op may still complete later. Only receives that outlive the channel timeout are cancelled
(``MPI_Cancel`` is reliable for them), so a timed-out recv cannot swallow a later message;
a caller's ``Work.wait(timeout)`` cancels nothing, and a later wait can still succeed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from mpi4py import MPI
from procgroup.channel import Work
from procgroup.errors import (
    CommTimeoutError,
    InvalidArgumentError,
    InvalidArrayError,
    PeerError,
    ProcGroupError,
)

log = logging.getLogger(__name__)

SPIN_S = 200e-6
YIELD_S = 20e-3
SLEEP_MIN_S = 50e-6
SLEEP_MAX_S = 1e-3

_perf = time.perf_counter
_yield = os.sched_yield


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


#: MPI error classes that mean the call itself was wrong, not that a peer or link failed.
_ARGUMENT_ERRORS = frozenset(
    getattr(MPI, name) for name in (
        "ERR_BUFFER", "ERR_COUNT", "ERR_TYPE", "ERR_TAG", "ERR_RANK", "ERR_ROOT", "ERR_GROUP",
        "ERR_OP", "ERR_ARG", "ERR_DIMS",
    ) if hasattr(MPI, name)
)


def _test(requests: Sequence[Any], status: Any) -> bool:
    if len(requests) == 1:
        return requests[0].Test(status)
    return MPI.Request.Testall(requests)


def wait_requests(requests: Sequence[Any], timeout: float, what: str, status: Any = None,
                  op: str | None = None) -> None:
    """Poll ``requests`` until all complete; CommTimeoutError after ``timeout`` seconds.

    ``status`` (single request only) receives the completed request's status; ``op``
    names the operation in the error (default: the first word of ``what``).
    """
    try:
        if _test(requests, status):
            return
        now = _perf()
        deadline = now + timeout
        spin_end = now + SPIN_S
        yield_end = now + YIELD_S
        nap = SLEEP_MIN_S
        while True:
            if _test(requests, status):
                return
            now = _perf()
            if now < spin_end:
                continue
            if now >= deadline:
                break
            if now < yield_end:
                _yield()
            else:
                time.sleep(min(nap, deadline - now))
                nap = min(nap * 2, SLEEP_MAX_S)
    except MPI.Exception as exc:
        raise translate(exc, what) from None
    raise CommTimeoutError(f"{what} did not complete within {timeout:g}s", op=op or what.split(" ")[0])


def requests_done(requests: Sequence[Any]) -> bool:
    """True when MPI is finished with every request (an error counts as finished)."""
    try:
        return bool(MPI.Request.Testall(requests))
    except MPI.Exception:
        return True


#: (requests, buffers) that MPI may still use but nobody waits on any more: ops that timed
#: out or were interrupted, Works dropped before their op completed. Module-wide, so they
#: outlive the channel that started them.
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


class MpiWork(Work):
    """Work over native MPI requests; ``wait`` polls with a deadline (see the module doc).

    ``finish`` runs once after completion (AVG division, copy-out of a staging buffer);
    for a receive, ``status`` gives the sender's rank as the result.
    """

    def __init__(self, op: str, requests: Sequence[Any], timeout: float,
                 finish: Callable[[], None] | None = None, status: Any = None, keep: Any = None,
                 is_recv: bool = False) -> None:
        self.op = op
        self._requests = list(requests)
        self._timeout = timeout
        self._finish = finish
        self._status = status
        self._done = False
        self._error: BaseException | None = None
        self._value: Any = None
        self._keep = keep  # objects (staging buffers) that must outlive the requests
        self._is_recv = is_recv

    def _complete(self) -> None:
        self._done = True
        if self._status is not None:
            self._value = self._status.Get_source()
        if self._finish is not None:
            finish, self._finish = self._finish, None
            try:
                finish()
            except BaseException as exc:  # noqa: BLE001 - reported through wait()
                self._error = exc

    def is_completed(self) -> bool:
        if self._done:
            return True
        try:
            if _test(self._requests, self._status):
                self._complete()
        except MPI.Exception as exc:
            self._done = True
            self._error = translate(exc, self.op)
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done:
            limit = self._timeout if timeout is None else float(timeout)
            try:
                wait_requests(self._requests, limit, self.op, self._status)
            except CommTimeoutError as exc:
                if timeout is not None:
                    raise  # the caller's own limit: the op stays pending, a later wait gets it
                if self._is_recv and cancel_recv(self._requests[0], self._status):
                    self._done = True
                    self._error = exc
                    raise
                if not self._is_recv:
                    raise
                # a message matched while cancelling: the receive is complete after all
            except ProcGroupError as exc:  # an MPI error: the requests are finished
                self._done = True
                self._error = exc
                raise
            # anything else (KeyboardInterrupt) leaves the op pending: a later wait, or
            # __del__, still accounts for its requests
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def __del__(self) -> None:
        # Dropping the last reference to a pending Work would free its requests and
        # buffers while MPI still uses them: park both until MPI is done.
        try:
            if not self._done and not MPI.Is_finalized():
                park(self._requests, (self._keep, self._finish, self._status))
        except Exception:  # noqa: BLE001 - never raise from a finalizer (or at shutdown)
            pass

    def result(self) -> Any:
        return self._value if self._done and self._error is None else None


__all__ = ["MpiWork", "cancel_recv", "park", "requests_done", "translate", "wait_requests"]
