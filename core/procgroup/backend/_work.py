"""Work: the handle of a started op, and the ordered thread that runs queued ops.

A backend's ``start_<op>`` returns a Work; a blocking call is that Work's ``wait()``.
Ops a backend runs on the caller's thread (``do_<op>``) become a :class:`FutureWork`
on the channel's :class:`OrderedExecutor` when the caller asks for ``async_op=True``.

Every Work is awaitable (``await work`` in a coroutine) without blocking the event loop.
How it waits depends on what the Work can do, chosen once per kind:

- :class:`FutureWork` is notified: its future's completion callback wakes the loop
  (``loop.call_soon_threadsafe``); the op's own timeout bounds it, on its thread.
- :class:`CompletedWork` is done; :class:`MappedWork` awaits the Work it wraps.
- Any other Work (a backend's own: tcp's posted receives, MPI requests, NCCL ops) is
  polled: :meth:`Work.is_completed` (which drives a backend's progress) between
  ``asyncio.sleep`` pauses that double from :data:`AWAIT_POLL_MIN_S` to
  :data:`AWAIT_POLL_MAX_S`, for at most :meth:`Work._await_limit` seconds (the group's
  timeout), after which the await raises :class:`~procgroup.errors.CommTimeoutError`.

Once done, the await calls :meth:`Work.wait`, which returns at once: the op's error is
raised at the ``await``, and a Work's finishing step (a staged copy back) runs there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

from ..errors import ChannelClosedError, CommTimeoutError, ProcGroupError, WorkCancelledError

#: the first pause (seconds) of an await that polls its Work: a short op is seen done
#: within a fraction of a millisecond ...
AWAIT_POLL_MIN_S = 5e-5
#: ... and the pause doubles up to this, so a long wait costs the loop one poll every few
#: milliseconds
AWAIT_POLL_MAX_S = 0.005


class Work:
    """Handle of an operation started with ``async_op=True`` (or isend/irecv).

    ``wait()`` blocks until the op is done and re-raises its error; with a ``timeout`` it
    raises :class:`~procgroup.errors.CommTimeoutError` when the op is still running (the
    op goes on; a later wait may still succeed).

    A Work is awaitable: ``await work`` in a coroutine waits without blocking the event
    loop and raises what ``wait()`` would (docs/asyncio.md).
    """

    op: str = "op"

    def is_completed(self) -> bool:
        """True once the op finished, successfully or not; never blocks."""
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; re-raise the op's error. Returns True like torch's Work."""
        raise NotImplementedError

    def exception(self) -> BaseException | None:
        """The op's error once it completed, else None."""
        return None

    def result(self) -> Any:
        """The op's value after :meth:`wait` (a receive: the sender's rank)."""
        return None

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def cancel(self) -> bool:
        """Withdraw a receive that no message has matched yet (``MPI_Cancel``): True when
        withdrawn, now or before (it never takes a message; ``wait()`` raises
        WorkCancelledError; the message goes to a later receive), False
        when it cannot be: a message matched it, it completed, or this backend cannot
        withdraw it (the default; ``DataChannel.cancels_recv`` says which backends can)."""
        return False

    def source_rank(self) -> int | None:
        """For a receive: the rank the message came from; None for ops without a source."""
        self.wait()
        value = self.result()
        return None if value is None else int(value)

    # ------------------------------------------------------------ asyncio
    def __await__(self) -> Generator[Any, None, bool]:
        """``await work``: wait for the op without blocking the event loop (other tasks
        run meanwhile); raises the op's error like :meth:`wait`, or
        :class:`~procgroup.errors.CommTimeoutError` past the group's timeout. Returns True.
        ``asyncio.gather(*works)`` waits for several; ``asyncio.wait_for(work, t)`` bounds
        the await (the op goes on, as after ``wait(timeout=t)``)."""
        return self._await_done().__await__()

    async def _await_done(self) -> bool:
        if not self.is_completed():
            await self._until_completed()
        return self.wait()  # done: returns at once, or raises the op's error

    async def _until_completed(self) -> None:
        """Return once :meth:`is_completed`; the default polls it (see the module doc).
        A Work that can notify its completion overrides this."""
        limit = self._await_limit()
        deadline = None if limit is None else time.monotonic() + limit
        pause = AWAIT_POLL_MIN_S
        while True:
            await asyncio.sleep(pause)
            if self.is_completed():
                return
            if deadline is not None and time.monotonic() >= deadline:
                self._await_expired(limit)
            pause = min(pause * 2, AWAIT_POLL_MAX_S)

    def _await_limit(self) -> float | None:
        """How long (seconds) a polled ``await`` waits for this Work: a backend's Work
        returns its group's timeout. None (the default) puts no limit of its own: the op
        must be bounded by its backend (a deadline that fails it)."""
        return None

    def _await_expired(self, limit: float | None) -> None:
        """A polled await ran out :meth:`_await_limit`: withdraw a receive (as a blocking
        wait past the group's timeout does) and raise CommTimeoutError."""
        withdrawn = self.cancel()
        if self.is_completed() and not withdrawn:
            return  # it completed at the last moment: the await's wait() reports it
        raise CommTimeoutError(f"{self.op} did not finish within the group's timeout ({limit:g} s) "
                               f"while awaited", op=self.op)


class CompletedWork(Work):
    """A Work that is already done (world size 1, empty arrays, an inline send, ...)."""

    __slots__ = ("op", "_value")

    def __init__(self, op: str, value: Any = None) -> None:
        self.op = op
        self._value = value

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: float | None = None) -> bool:
        return True

    def result(self) -> Any:
        return self._value

    async def _until_completed(self) -> None:
        return None


class FutureWork(Work):
    """A Work backed by a ``concurrent.futures.Future`` (ops run on a helper thread)."""

    def __init__(self, op: str, future: concurrent.futures.Future[Any]) -> None:
        self.op = op
        self._future = future
        self._withdrawn = False

    def is_completed(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        # not future.result(timeout): on 3.11+ its TimeoutError would also catch the op's
        # own CommTimeoutError (a TimeoutError subclass) and hide its message
        done, _ = concurrent.futures.wait([self._future], timeout=timeout)
        if not done:
            raise CommTimeoutError(f"{self.op} not finished after Work.wait(timeout={timeout})", op=self.op)
        if self._future.cancelled():
            raise self._cancelled()
        self._future.result()
        return True

    def cancel(self) -> bool:
        """A receive only (a collective withdrawn on one rank would strand the others),
        and only while it is still queued: one that runs goes on."""
        self._withdrawn = self._withdrawn or (self.op == "recv" and self._future.cancel())
        return self._withdrawn

    def _cancelled(self) -> ProcGroupError:
        if self._withdrawn:
            return WorkCancelledError(f"{self.op} was withdrawn with Work.cancel() before it ran")
        return ChannelClosedError(f"{self.op} was cancelled: the group was destroyed before it ran")

    def exception(self) -> BaseException | None:
        if not self._future.done():
            return None
        if self._future.cancelled():
            return self._cancelled()
        return self._future.exception()

    def result(self) -> Any:
        if not self._future.done() or self._future.cancelled():
            return None
        return self._future.result()

    async def _until_completed(self) -> None:
        """Woken by the future's completion callback: the op runs on a channel thread,
        bounded by the op's own timeout there, so this needs no limit of its own."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake(_: Any) -> None:
            try:
                loop.call_soon_threadsafe(_settle, woken)
            except RuntimeError:  # the loop was closed meanwhile: nobody awaits any more
                pass

        self._future.add_done_callback(wake)  # runs at once when already done
        await woken


class MappedWork(Work):
    """Another Work whose result is passed through ``mapping`` (e.g. a rank translation)
    and whose first successful wait runs ``then`` (e.g. copy a staged result back)."""

    def __init__(self, inner: Work, mapping: Callable[[Any], Any] | None = None,
                 then: Callable[[], None] | None = None) -> None:
        self.op = inner.op
        self._inner = inner
        self._map = mapping
        self._then = then

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def wait(self, timeout: float | None = None) -> bool:
        self._inner.wait(timeout)
        then, self._then = self._then, None
        if then is not None:
            then()
        return True

    def exception(self) -> BaseException | None:
        return self._inner.exception()

    def cancel(self) -> bool:
        return self._inner.cancel()

    def result(self) -> Any:
        value = self._inner.result()
        return self._map(value) if self._map is not None and value is not None else value

    async def _until_completed(self) -> None:
        await self._inner._until_completed()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # the awaiting task may have been cancelled meanwhile
        waiter.set_result(None)


class OrderedExecutor:
    """One worker thread per channel, so queued ops run in the order they were issued.

    Every rank issues collectives in the same order; running them one at a time in that
    order keeps the ranks matched whatever the transport.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)
            self._pending += 1
        fut = self._pool.submit(fn, *args)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _: Any) -> None:
        with self._lock:
            self._pending -= 1

    @property
    def busy(self) -> bool:
        return self._pending > 0

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["AWAIT_POLL_MAX_S", "AWAIT_POLL_MIN_S", "CompletedWork", "FutureWork", "MappedWork", "OrderedExecutor", "Work"]
