"""In-flight NCCL ops: events on the procgroup stream, the Work handle, the watchdog.

An op is enqueued on the channel's stream and ends with an event. ``Work.wait()`` makes
the caller's stream wait on that event (torch's semantics: the host does not block);
with a timeout, or for barrier, it also waits on the host, polling the event. A
watchdog thread keeps the op's arrays alive until the event fires (another stream must
not reuse their memory) and aborts the communicator when an op outlives the channel
timeout or NCCL reports an asynchronous error, so no rank hangs forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from procgroup.channel import Work
from procgroup.errors import CommTimeoutError

from ._streams import caller_stream

log = logging.getLogger(__name__)

_POLL_MAX = 0.002  # seconds between event queries while the host waits
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
        end = time.monotonic() + timeout
        pause = 0.0
        while not self.done():
            if time.monotonic() >= end:
                return False
            time.sleep(pause)
            pause = min(_POLL_MAX, pause * 2 + 1e-5)
        return True


class NcclWork(Work):
    """The Work of an nccl op started with async_op=True (or isend/irecv)."""

    def __init__(self, inflight: Inflight, *, host_sync: bool = False, default_timeout: float | None = None) -> None:
        self.op = inflight.op
        self._inflight = inflight
        self._host_sync = host_sync  # barrier: wait() blocks the host as well
        self._default_timeout = default_timeout  # blocking-wait mode: host waits this long

    def is_completed(self) -> bool:
        return self._inflight.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Order the caller's stream after the op; block the host too when asked to.

        The host blocks when ``timeout`` is given, for barrier, and in blocking-wait mode
        (PROCGROUP_NCCL_BLOCKING_WAIT=1); it raises CommTimeoutError when the op is not
        done by then. Errors found by the watchdog (timeout, NCCL async error) re-raise.
        """
        inflight = self._inflight
        self._raise_error()
        inflight.hand_to_caller()
        limit = timeout if timeout is not None else (
            self._default_timeout if (self._host_sync or self._default_timeout is not None) else None
        )
        if self._host_sync and limit is None:
            limit = inflight.deadline - time.monotonic()
        if limit is not None and not inflight.host_wait(max(0.0, limit)):
            self._raise_error()
            raise CommTimeoutError(
                f"nccl {self.op} not finished after Work.wait(timeout={limit:.3g})", op=self.op
            )
        self._raise_error()
        return True

    def _raise_error(self) -> None:
        err = self._inflight.error
        if err is not None:
            raise err

    def exception(self) -> BaseException | None:
        return self._inflight.error

    def result(self) -> Any:
        return self._inflight.value if self._inflight.done() else None


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
            log.error("%s: %s", self._name, error)
            self._on_failure(error)  # the channel aborts and calls fail_all


__all__ = ["Inflight", "NcclWork", "Watchdog"]
