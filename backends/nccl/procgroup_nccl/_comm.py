"""NCCL communicators: the unique id made by rank 0, shared through the Store.

Rank 0 of the group calls ``ncclGetUniqueId`` and publishes it under a key of the
channel's private Store; the others read it. Before ``ncclCommInitRank`` (which blocks
with no timeout of its own) every rank checks in under the same key and waits for all
the others with the channel's timeout, so a missing rank is a StoreTimeoutError naming
the keys, not a hang.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from procgroup.errors import InvalidArgumentError

log = logging.getLogger(__name__)


def uid_to_bytes(uid: Any) -> bytes:
    """CuPy >= 14 returns bytes; older CuPy a tuple of 128 (signed) char values."""
    if isinstance(uid, (bytes, bytearray)):
        return bytes(uid)
    return bytes(int(x) & 0xFF for x in uid)


def uid_for_cupy(raw: bytes, cupy_major: int) -> Any:
    """The unique id in the form this CuPy's NcclCommunicator takes."""
    if cupy_major >= 14:
        return bytes(raw)
    return tuple(b - 256 if b >= 128 else b for b in raw)


def _cupy_major() -> int:
    import cupy

    try:
        return int(cupy.__version__.split(".")[0])
    except ValueError:
        return 14


def exchange_unique_id(store: Any, key: str, rank: int, timeout: float) -> bytes:
    """Rank 0 makes the id and sets ``key``; everyone returns it (waits ``timeout``)."""
    if rank == 0:
        from cupy.cuda import nccl

        raw = uid_to_bytes(nccl.get_unique_id())
        store.set(key, raw)
        return raw
    return bytes(store.get(key, timeout=timeout))


def check_in(store: Any, key: str, rank: int, size: int, value: str, timeout: float) -> list[str]:
    """Every rank sets ``key/r<rank>`` = value and waits for all; returns all the values."""
    store.set(f"{key}/r{rank}", value)
    keys = [f"{key}/r{r}" for r in range(size)]
    store.wait(keys, timeout=timeout)
    return [bytes(store.get(k, timeout=timeout)).decode() for k in keys]


def create_communicator(store: Any, key: str, rank: int, size: int, device: int, timeout: float) -> Any:
    """One NcclCommunicator for this process's ``device``; collective over the group."""
    import cupy
    from cupy.cuda import nccl

    raw = exchange_unique_id(store, f"{key}/uid", rank, timeout)
    check_in(store, f"{key}/in", rank, size, str(device), timeout)
    with cupy.cuda.Device(device):
        comm = nccl.NcclCommunicator(size, uid_for_cupy(raw, _cupy_major()), rank)
    log.debug("nccl communicator %s: rank %d of %d on cuda:%d", key, rank, size, device)
    return comm


def create_multi_communicators(store: Any, key: str, rank: int, size: int, devices: Sequence[int],
                               timeout: float) -> list[Any]:
    """One communicator per device, NCCL rank ``rank * len(devices) + i`` (group call)."""
    import cupy
    from cupy.cuda import nccl

    ndev = len(devices)
    raw = exchange_unique_id(store, f"{key}/uid", rank, timeout)
    counts = check_in(store, f"{key}/in", rank, size, str(ndev), timeout)
    if any(int(c) != ndev for c in counts):
        raise InvalidArgumentError(
            f"*_multigpu: every process must pass the same number of GPUs; the group's "
            f"processes pass {[int(c) for c in counts]}"
        )
    uid = uid_for_cupy(raw, _cupy_major())
    comms: list[Any] = []
    nccl.groupStart()
    try:
        for i, dev in enumerate(devices):
            with cupy.cuda.Device(dev):
                comms.append(nccl.NcclCommunicator(size * ndev, uid, rank * ndev + i))
    finally:
        nccl.groupEnd()
    return comms


def close_communicator(comm: Any, *, abort: bool) -> None:
    """Abort (pending work may never finish) or destroy (all done); never raises."""
    try:
        if abort:
            comm.abort()
        else:
            comm.destroy()
    except Exception:
        log.debug("closing an nccl communicator failed", exc_info=True)


__all__ = [
    "check_in",
    "close_communicator",
    "create_communicator",
    "create_multi_communicators",
    "exchange_unique_id",
    "uid_for_cupy",
    "uid_to_bytes",
]
