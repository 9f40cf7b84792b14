"""torch's ``monitored_barrier``: a barrier that names the ranks that did not arrive.

It runs on the job's Store, not on the group's channel, so it works on every backend and
a missing rank cannot leave a half-done collective behind: each member other than group
rank 0 sets its arrival key; group rank 0 waits for them until the timeout, then
publishes the verdict (the missing world ranks), which every arrived member reads, so all
of them raise the same error or none does. ``wait_all_ranks=False`` names the first
missing rank (torch's rule), True names them all.

Keys are removed once nobody needs them: group rank 0 deletes the arrival keys it saw,
and the last member to read the verdict (a Store counter tells which) deletes the
verdict and the counter. A call that timed out leaves the keys of late or missing
members; group rank 0 deletes them at its next call, once every member has arrived there
(so has finished the earlier call).
"""

from __future__ import annotations

import json
import time
from typing import Any

from . import _state
from ._settings import timeout_seconds
from ._torch_args import member_or_none, torch_names
from .errors import CommTimeoutError
from .groups import Group

#: monitored barriers run so far per group id (the same count on every member)
_calls: dict[int, int] = {}
#: group id -> group rank 0's calls that timed out since every member last arrived (their
#: keys may remain)
_leftover: dict[int, list[str]] = {}


@torch_names()
def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """Return once every member arrived; else raise CommTimeoutError naming who did not
    (within ``timeout``: seconds or a timedelta, default the group's timeout)."""
    g = member_or_none(group, "monitored_barrier")
    if g is None:
        return
    st = _state.world()
    seconds = st.timeout if timeout is None else timeout_seconds(timeout)
    seq = _calls.get(g.group_id, 0)
    _calls[g.group_id] = seq + 1
    key = f"procgroup/monitored_barrier/{g.group_id}/{seq}"
    if g.rank == 0:
        missing = _wait_arrivals(st.store, key, g, seconds)
        _clean_up(st.store, key, g, missing)
        if missing and not wait_all_ranks:
            missing = missing[:1]
        st.store.set(f"{key}/verdict", json.dumps(missing))
    else:
        st.store.set(f"{key}/{g.rank}", "1")
        try:
            missing = json.loads(st.store.get(f"{key}/verdict", timeout=seconds + max(5.0, seconds)))
        except CommTimeoutError:
            raise CommTimeoutError(f"monitored_barrier: group rank 0 (world rank {g.global_rank(0)}) gave no "
                                   f"verdict within {seconds:g}s", op="monitored_barrier") from None
    if st.store.add(f"{key}/out", 1) == g.size:  # the last reader of the verdict (rank 0 counts too)
        st.store.delete_key(f"{key}/verdict")
        st.store.delete_key(f"{key}/out")
    if missing:
        raise CommTimeoutError(f"monitored_barrier: rank(s) {missing} did not reach the barrier within "
                               f"{seconds:g}s (group {list(g.ranks)})", op="monitored_barrier")


def _clean_up(store: Any, key: str, g: Group, missing: list[int]) -> None:
    """Group rank 0, after waiting at call ``key``: delete the arrival keys it saw (their
    setters never read them again). When every member arrived, also delete the keys of
    earlier timed-out calls (every member has finished those to arrive at this one);
    else remember this call's, which a late member may still set or read."""
    late = {g.group_rank(r, "monitored_barrier") for r in missing}
    for r in range(1, g.size):
        if r not in late:
            store.delete_key(f"{key}/{r}")
    earlier = _leftover.setdefault(g.group_id, [])
    if missing:
        earlier.append(key)
        return
    for old in earlier:
        for r in range(1, g.size):
            store.delete_key(f"{old}/{r}")
        store.delete_key(f"{old}/verdict")
        store.delete_key(f"{old}/out")
    earlier.clear()


def _wait_arrivals(store: Any, key: str, g: Group, seconds: float) -> list[int]:
    """The world ranks of the members whose arrival key is still missing at the deadline."""
    deadline = time.monotonic() + seconds
    waiting = list(range(1, g.size))
    nap = 0.0005
    while waiting:
        waiting = [r for r in waiting if not store.check([f"{key}/{r}"])]
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(nap)
        nap = min(nap * 2, 0.05)
    return [g.global_rank(r) for r in waiting]


__all__ = ["monitored_barrier"]
