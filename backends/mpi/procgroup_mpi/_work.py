"""MpiWork: the Work over one native MPI request, which every op of the channel returns.

A blocking call is ``start_<op>(...).wait()`` (procgroup.backend), so ``wait`` is on
most calls' path: it tests the request, spins on ``Test`` a fixed number of times (a
small op ends within them, with no clock reads), then hands over to
:func:`procgroup.backend.poll` (spin, yield, sleep) with a deadline.

What happens when a wait ends early:

- ``wait(timeout)``, the caller's own limit: CommTimeoutError, nothing is cancelled; a
  later wait can still succeed.
- ``wait()`` past the channel timeout: CommTimeoutError (a collective names the members
  it waited on: MPI cannot say which one is missing). A receive is cancelled (so it
  cannot swallow a later message); anything else stays pending.
- A Work dropped while its op is pending (a timeout, Ctrl-C, or never waited on):
  the request and the op's buffers are parked until MPI is done with them
  (:func:`._requests.park`); a receive is cancelled instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI
from procgroup.backend import Work, poll
from procgroup.errors import CommTimeoutError, InvalidArrayError, WorkCancelledError

from ._buffers import nbytes
from ._requests import cancel_recv, park, translate

if TYPE_CHECKING:
    from .channel import MpiChannel

#: Test calls made before the timed poll: small ops end within them, without a clock read.
SPIN = range(1000)
_is_finalized = MPI.Is_finalized


class MpiWork(Work):
    """An op on one MPI request. ``keep`` (the op's arrays) and ``_finish`` (AVG's division)
    outlive the request; ``_finish`` runs once after it completes.

    Only what every op sets is a slot; the rest are class defaults that the rare op
    overrides on the instance, so a small collective stores five fields.
    """

    __slots__ = ("_channel", "_done", "_keep", "_req", "op")
    _finish: Callable[[], None] | None = None
    _status: Any = None  # a receive's: who sent, how much
    _error: BaseException | None = None
    _value: Any = None

    def __init__(self, channel: MpiChannel, op: str, req: Any, keep: Any) -> None:
        self.op = op
        self._channel = channel
        self._req = req
        self._keep = keep
        self._done = False

    def then(self, finish: Callable[[], None]) -> MpiWork:
        """Run ``finish`` once the request completed (before wait returns); returns self."""
        self._finish = finish
        return self

    # ------------------------------------------------------------ the caller's side
    def wait(self, timeout: float | None = None) -> bool:
        if not self._done:
            test = self._req.Test
            status = self._status
            try:
                if not test(status):
                    for _ in SPIN:  # the bare loop first: a small op ends within it
                        if test(status):
                            break
                    else:
                        self._poll(timeout)
            except MPI.Exception as exc:  # the request is finished, with an error
                self._fail(exc)
            # anything else (a timeout, Ctrl-C) leaves the op pending: a later wait, or
            # __del__, still accounts for its request
            self._done = True
            if self._finish is not None:
                self._run_finish()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._done:
            try:
                done = self._req.Test(self._status)
            except MPI.Exception as exc:
                self._done = True
                self._error = translate(exc, self._what())
                return True
            if done:
                self._done = True
                if self._finish is not None:
                    self._run_finish()
        return self._done

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def result(self) -> Any:
        return self._value  # set only by a receive that completed without error

    def _await_limit(self) -> float:
        return self._channel.timeout  # ``await`` polls as long as a blocking wait() waits

    # ------------------------------------------------------------ the op's side
    def _poll(self, timeout: float | None) -> None:
        """Poll until done; CommTimeoutError after ``timeout`` (None: the channel's)."""
        limit = self._channel.timeout if timeout is None else float(timeout)
        req, status = self._req, self._status
        # check: a close() (destroy_process_group) or a broken channel ends the wait at once
        poll(lambda: req.Test(status), limit, check=self._channel.check_usable,
             on_timeout=lambda: self._timed_out(limit, timeout is None))

    def _fail(self, exc: BaseException) -> None:
        """The request ended with an MPI error: record it as procgroup's and raise it."""
        self._done = True
        self._error = translate(exc, self._what())
        raise self._error from None

    def _timed_out(self, limit: float, channel_timeout: bool) -> BaseException:
        ranks = self._channel.others()
        message = f"{self._what()} did not complete within {limit:g}s"
        if channel_timeout:
            where = ", ".join(f"rank {r}" for r in ranks)
            message += f": not every member joined it (MPI cannot say which; waiting on {where})"
        return CommTimeoutError(message, op=self.op, ranks=ranks)

    def _what(self) -> str:
        return self.op

    def _run_finish(self) -> None:
        finish, self._finish = self._finish, None
        try:
            finish()  # type: ignore[misc]  # set whenever _run_finish is scheduled
        except BaseException as exc:  # noqa: BLE001 - reported through wait()
            self._error = exc

    def _abandon(self) -> None:
        park([self._req], (self._keep, self._finish))

    def __del__(self) -> None:
        # Dropping the last reference to a pending Work would free its request and
        # buffers while MPI still uses them.
        if not self._done:
            try:
                if not _is_finalized():
                    self._abandon()
            except Exception:  # noqa: BLE001 - never raise from a finalizer (or at shutdown)
                pass


def short_message(channel: MpiChannel, status: Any, array: Any) -> InvalidArrayError | None:
    """The error for a completed receive (its message in bytes, MPI_BYTE) whose message
    was shorter than ``array`` (MPI raises truncation for a longer one), or None when the
    sizes match."""
    got = status.Get_count()
    return None if got == nbytes(array) else size_error(channel, status, got, array)


def size_error(channel: MpiChannel, status: Any, got: int, array: Any) -> InvalidArrayError:
    """The error for a receive of ``got`` bytes into ``array`` of another size."""
    source = channel.ctx.global_rank(status.Get_source())
    dtype = np.dtype(array.dtype)
    itemsize = dtype.itemsize
    has = f"{got // itemsize} elements of {itemsize} bytes" if got % itemsize == 0 else f"{got} bytes"
    return InvalidArrayError(
        f"message from rank {source} has {has} but the receive buffer has {nbytes(array) // itemsize} "
        f"(dtype {dtype}); sizes must match"
    )


class SendWork(MpiWork):
    """A send: names its destination and tag in errors."""

    __slots__ = ("_peer", "_tag")

    def __init__(self, channel: MpiChannel, req: Any, keep: Any, peer: int, tag: int) -> None:
        super().__init__(channel, "send", req, keep)
        self._peer = peer
        self._tag = tag

    def _what(self) -> str:
        return f"send to rank {self._channel.ctx.global_rank(self._peer)} (tag {self._tag})"

    def _timed_out(self, limit: float, channel_timeout: bool) -> BaseException:
        return CommTimeoutError(f"{self._what()} did not complete within {limit:g}s", op="send",
                                ranks=[self._channel.ctx.global_rank(self._peer)])


class RecvWork(MpiWork):
    """A receive: its result is the sender; a short message is an InvalidArrayError (MPI
    raises truncation for a long one); cancelled after the channel timeout or when dropped."""

    __slots__ = ("_peer", "_settled", "_status", "_tag", "_value")

    def __init__(self, channel: MpiChannel, req: Any, array: Any, peer: int | None, tag: int,
                 status: Any) -> None:
        super().__init__(channel, "recv", req, array)
        self._status = status
        self._value = None
        self._settled = False
        self._peer = peer
        self._tag = tag

    def wait(self, timeout: float | None = None) -> bool:
        try:
            super().wait(timeout)
        except CommTimeoutError as exc:
            if timeout is not None or self._done:
                raise  # the caller's own limit: the receive stays posted, a later wait gets it
            try:
                cancelled = cancel_recv(self._req, self._status)
            except MPI.Exception as mpi_exc:  # a message matched, and failed (truncation)
                self._fail(mpi_exc)
            self._done = True
            if cancelled:
                self._error = exc
                raise
            # a message matched while cancelling: the receive is complete after all
        self._settle()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        done = super().is_completed()
        if done:
            self._settle()
        return done

    def cancel(self) -> bool:
        """MPI_Cancel: False when a message matched first (the receive then completes)."""
        if self._done:
            return isinstance(self._error, WorkCancelledError)
        try:
            cancelled = cancel_recv(self._req, self._status)
        except MPI.Exception as exc:  # a message matched, and failed (truncation)
            self._done = True
            self._error = translate(exc, self._what())
            return False
        self._done = True
        if cancelled:
            self._error = WorkCancelledError(f"{self._what()} was withdrawn with Work.cancel()")
        else:
            self._settle()
        return cancelled

    def _settle(self) -> None:
        """Once complete: the sender, or an error when the message was short."""
        if self._settled or self._error is not None:
            return
        self._settled = True
        self._error = short_message(self._channel, self._status, self._keep)
        if self._error is None:
            self._value = self._status.Get_source()

    def _what(self) -> str:
        who = "any rank" if self._peer is None else f"rank {self._channel.ctx.global_rank(self._peer)}"
        return f"recv from {who} (tag {self._tag})"

    def _timed_out(self, limit: float, channel_timeout: bool) -> BaseException:
        ranks = [] if self._peer is None else [self._channel.ctx.global_rank(self._peer)]
        return CommTimeoutError(f"{self._what()} did not complete within {limit:g}s", op="recv", ranks=ranks)

    def _abandon(self) -> None:
        cancel_recv(self._req, self._status)


__all__ = ["SPIN", "MpiWork", "RecvWork", "SendWork", "short_message", "size_error"]
