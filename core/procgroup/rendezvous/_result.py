"""The result of a rendezvous and the arrival protocol every init method ends with."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from procgroup.errors import RendezvousError, StoreTimeoutError

from ._prefix import PrefixStore
from ._store import Store

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RendezvousResult:
    """What an init method hands to ``init_process_group``."""

    store: Store
    rank: int
    world_size: int
    #: Host/IP at which rank 0 is reached (None for file://); the tcp backend uses it to
    #: choose the interface that routes there.
    master_addr: str | None
    #: The job's key (procgroup._auth.job_key): every connection the job opens proves it.
    #: None: the init method does not know it; the core then resolves the token itself.
    job_key: bytes | None = None


def job_store(base: Store, group_name: str) -> PrefixStore:
    """The store a job sees: its own key space inside ``base``; closing it closes base."""
    return PrefixStore(f"procgroup/{group_name or 'default'}", base, owns_store=True)


def join(
    store: Store,
    scheme: str,
    rank: int,
    world_size: int,
    deadline: float,
    master_addr: str | None,
    *,
    total_timeout: float,
    assign_rank: bool = False,
    job_key: bytes | None = None,
) -> RendezvousResult:
    """Record this rank's arrival and wait for all ``world_size`` ranks.

    Each rank sets ``rdzv/rank/<r>`` (a counter, so a rank used twice is caught), so a
    timeout can name the ranks that never came. Closes ``store`` on failure.
    """
    try:
        if assign_rank:
            rank = store.add("rdzv/next_rank", 1) - 1
            if rank >= world_size:
                raise RendezvousError(
                    f"{scheme}: {rank + 1} processes joined a job of world_size "
                    f"{world_size}; the store is left over from an earlier job or shared "
                    "by two jobs (delete it, or give each job its own group_name)"
                )
        agreed = store.compare_set("rdzv/world_size", b"", str(world_size).encode())
        if agreed != str(world_size).encode():
            raise RendezvousError(
                f"{scheme}: this rank says world_size={world_size} but another rank "
                f"already joined with world_size={agreed.decode(errors='replace')}; a "
                "different job holds this port, or the ranks were launched inconsistently"
            )
        if store.add(f"rdzv/rank/{rank}", 1) > 1:
            raise RendezvousError(
                f"{scheme}: rank {rank} joined twice: another process already holds rank {rank} "
                "in this store; a different job holds this port (give each job its own port, "
                "and a job token: PROCGROUP_JOB_TOKEN), or two processes were given the same rank"
            )
        keys = [f"rdzv/rank/{r}" for r in range(world_size)]
        timeout = max(0.0, deadline - time.monotonic())
        try:
            store.wait(keys, timeout)
        except StoreTimeoutError:
            missing = [r for r in range(world_size) if not store.check([keys[r]])]
            raise StoreTimeoutError(
                f"{scheme}: rendezvous timed out after {total_timeout:g}s: "
                f"{world_size - len(missing)} of {world_size} ranks arrived; "
                f"missing ranks {missing}",
                op="rendezvous",
                ranks=missing,
            ) from None
    except BaseException:
        store.close()
        raise
    logger.debug("%s: rank %d of %d joined", scheme, rank, world_size)
    return RendezvousResult(store, rank, world_size, master_addr, job_key)

