"""One wait for every backend: poll a condition until it holds, the deadline passes, or
a check (a dead peer, a closed channel) raises.

Three phases, so a short op sees no added latency and a long wait (a rank late to a
collective) does not starve an oversubscribed machine: spin on the test for ``spin``
seconds, then test and ``sched_yield`` until ``yield_for``, then test and sleep, the
nap doubling up to ``nap_max``. ``check`` runs every ``check_every`` seconds once the
spin phase is over, so peer-death checks cost nothing on the fast path. A wait that
outlasts its spin tells the flight recorder once (:func:`~procgroup.backend._recorder.waiting`),
which then names the waiting op's caller: only slow ops pay for that.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable

if TYPE_CHECKING:
    from ._work import Work

from ..errors import CommTimeoutError
from ._recorder import SLOW_S as _SLOW_S
from ._recorder import waiting as _recorder_waiting

_perf = time.perf_counter
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def poll(test: Callable[[], bool], timeout: float, *, what: str = "", op: str = "",
         check: Callable[[], None] | None = None,
         on_timeout: Callable[[], BaseException] | None = None,
         spin: float = 200e-6, yield_for: float = 20e-3, nap_min: float = 50e-6,
         nap_max: float = 1e-3, check_every: float = 1e-3) -> None:
    """Return once ``test()`` is true; raise ``on_timeout()`` (default: CommTimeoutError
    naming ``what``) after ``timeout`` seconds; ``check()`` may raise to end the wait early."""
    if test():
        return
    now = _perf()
    deadline = now + timeout
    spin_end = now + spin
    yield_end = now + yield_for
    slow_at = now + _SLOW_S  # then the flight recorder names the op's caller, once
    next_check = spin_end
    nap = nap_min
    while True:
        if test():
            return
        now = _perf()
        if now < spin_end:
            continue
        if now >= slow_at:
            slow_at = deadline + 1.0
            _recorder_waiting()
        if check is not None and now >= next_check:
            check()
            next_check = now + check_every
        if now >= deadline:
            if test():
                return
            if on_timeout is not None:
                raise on_timeout()
            raise CommTimeoutError(f"{what or op or 'the wait'} did not complete within {timeout:g}s",
                                   op=op or what.split(" ")[0])
        if now < yield_end:
            _yield()
        else:
            time.sleep(min(nap, max(deadline - now, 0.0)))
            nap = min(nap * 2, nap_max)


def late_peers(works: Iterable[tuple[int, Work]], timeout: float) -> list[int]:
    """Wait for each (peer, Work) under one shared deadline; return the peers (in order,
    once each) whose Work had not finished by then. For arrival checks that must name
    the ranks that never came rather than raise at the first."""
    deadline = time.monotonic() + timeout
    late: list[int] = []
    for peer, work in works:
        if peer in late:
            continue
        try:
            work.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except CommTimeoutError:
            late.append(peer)
    return late


__all__ = ["late_peers", "poll"]
