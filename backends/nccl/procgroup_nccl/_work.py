"""In-flight NCCL ops: events on the procgroup stream, the Work handle, the watchdog.

An op is enqueued on the channel's stream and ends with an event. ``Work.wait()`` makes
the caller's stream wait on that event (torch's semantics: the host does not block);
with a timeout, for barrier, and in blocking-wait mode it also waits on the host,
polling the event. A blocking call is the same start + wait. A watchdog thread keeps
the op's arrays alive until the event fires (another stream must not reuse their
memory) and aborts the communicator when an op outlives the channel timeout or NCCL
reports an asynchronous error, so no rank hangs forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from procgroup.backend import Work, poll
from procgroup.errors import CommTimeoutError

from ._streams import caller_stream

log = logging.getLogger(__name__)

_WATCH_INTERVAL = 0.05


class Inflight:
    """One enqueued op: its completion events (one per GPU) and what must stay alive."""

    def __init__(self, op: str, events: Sequence[tuple[int, Any]], keep: tuple[Any, ...],
                 deadline: float, result: Any = None) -> None:
        self.op = op
        self.events = list(events)
        self.keep: tuple[Any, ...] | None = keep
        self.deadline = deadline
        self.value = result
        self.error: BaseException | None = None
        self._done = False

    def done(self) -> bool:
        """True once every event fired (queried, never blocking) or the op failed."""
        if self._done or self.error is not None:
            return True
        import cupy

        for device, event in self.events:
            with cupy.cuda.Device(device):
                if not event.done:
                    return False
        self._done = True
        return True

    def hand_to_caller(self) -> None:
        """Make the caller's stream on each GPU wait for this op (no host blocking)."""
        import cupy

        for device, event in self.events:
            with cupy.cuda.Device(device):
                caller_stream().wait_event(event)

    def host_wait(self, timeout: float) -> bool:
        """Block the host until done or ``timeout`` seconds passed; True when done."""
        try:
            poll(self.done, max(0.0, timeout), op=self.op)
        except CommTimeoutError:
            return False
        return True


class NcclWork(Work):
    """The Work of every nccl op: a blocking call is its ``wait()``.

    ``abort(error)`` breaks the channel (the communicator is aborted); ``host_sync``
    (barrier) and ``blocking`` (blocking-wait mode) make wait() block the host until the
    op's deadline, ``timeout`` is the channel's (for the message).
    """

    def __init__(self, inflight: Inflight, abort: Callable[[BaseException], None], timeout: float, *,
                 host_sync: bool = False, blocking: bool = False) -> None:
        self.op = inflight.op
        self._inflight = inflight
        self._abort = abort
        self._timeout = timeout
        self._host_sync = host_sync or blocking

    def is_completed(self) -> bool:
        return self._inflight.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Order the caller's stream after the op; block the host too when asked to.

        With ``timeout`` the host waits that long and raises CommTimeoutError when the op
        is not done (the op goes on). For barrier and in blocking-wait mode
        (PROCGROUP_NCCL_BLOCKING_WAIT=1) it waits until the op's deadline (the group
        timeout after it started); past it the communicator is aborted. Errors found by
        the watchdog (timeout, NCCL async error) re-raise.
        """
        inflight = self._inflight
        self._raise_error()
        inflight.hand_to_caller()
        if timeout is not None:
            if not inflight.host_wait(timeout):
                self._raise_error()
                raise CommTimeoutError(f"nccl {self.op} not finished after Work.wait(timeout={timeout:.3g})",
                                       op=self.op)
        elif self._host_sync and not inflight.host_wait(inflight.deadline - time.monotonic()):
            self._raise_error()
            err = CommTimeoutError(
                f"nccl {self.op} did not finish within {self._timeout:g} s; the communicator was aborted",
                op=self.op,
            )
            self._abort(err)
            raise err
        self._raise_error()
        return True

    def _await_limit(self) -> float:
        # ``await`` waits for the op on the GPU (not only for the caller's stream): the
        # watchdog fails it at its deadline, this margin only covers the watchdog's tick
        return max(0.0, self._inflight.deadline - time.monotonic()) + 5.0

    def _raise_error(self) -> None:
        err = self._inflight.error
        if err is not None:
            raise err

    def exception(self) -> BaseException | None:
        return self._inflight.error

    def result(self) -> Any:
        """recv's source (known when the op starts: NCCL receives from a named peer)."""
        return self._inflight.value


class Watchdog:
    """A daemon thread per channel: retires finished ops, aborts on timeout or async error."""

    def __init__(self, name: str, on_failure: Callable[[BaseException], None],
                 check_async: Callable[[], BaseException | None]) -> None:
        self._name = name
        self._on_failure = on_failure
        self._check_async = check_async
        self._items: list[Inflight] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def track(self, inflight: Inflight) -> None:
        with self._cond:
            self._items.append(inflight)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self) -> list[Inflight]:
        with self._cond:
            return [i for i in self._items if not i.done()]

    def fail_all(self, error: BaseException) -> None:
        """Mark every tracked op failed with ``error`` and let go of its arrays."""
        with self._cond:
            items, self._items = self._items, []
        for item in items:
            if not item.done():
                item.error = error
            item.keep = None

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                items = list(self._items)
            try:
                self._sweep(items)
            except Exception:
                log.exception("nccl watchdog sweep failed")
            time.sleep(_WATCH_INTERVAL)

    def _sweep(self, items: list[Inflight]) -> None:
        now = time.monotonic()
        finished = [i for i in items if i.done()]
        late = [i for i in items if i not in finished and now > i.deadline]
        with self._cond:
            self._items = [i for i in self._items if i not in finished]
        for item in finished:
            item.keep = None
        error = self._check_async()
        if error is None and late:
            ops = ", ".join(sorted({i.op for i in late}))
            error = CommTimeoutError(
                f"nccl {ops} did not finish within the group timeout; the NCCL communicator "
                f"was aborted (a peer rank is missing, dead or issued collectives in another order)",
                op=late[0].op,
            )
        if error is not None:
            self._on_failure(error)  # the channel records (and logs) it, aborts, calls fail_all


__all__ = ["Inflight", "NcclWork", "Watchdog"]
