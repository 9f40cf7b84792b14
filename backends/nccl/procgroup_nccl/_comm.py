"""NCCL communicators: the unique id made by rank 0, shared through the Store.

Rank 0 of the group calls ``ncclGetUniqueId`` and publishes it under a key of the
channel's private Store; the others read it. Before ``ncclCommInitRank`` (which blocks
with no timeout of its own) every rank checks in under the same key and waits for all
the others with the channel's timeout, so a missing rank is a StoreTimeoutError naming
the keys, not a hang.

The check-in carries each rank's GPU (host, PCI bus id): NCCL refuses two ranks of one
communicator on one GPU ("Duplicate GPU detected", an unhandled system error after a
hang-prone init), so ranks that share one are refused here first, with an error that
names them, before NCCL is called. A GPU whose bus id CuPy cannot tell is left out of
that check (its identity names the process), never taken for another rank's GPU.
"""

from __future__ import annotations

import logging
import os
import socket
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


def host_id() -> str:
    """This machine: its host name and boot id (two containers of one host share the boot id)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def gpu_identity(device: int) -> str:
    """Which physical GPU ``device`` (an index of this process's CUDA_VISIBLE_DEVICES) is:
    ``host|PCI bus id``, the same string in every process that sees that GPU."""
    import cupy

    try:
        bus: str | None = str(cupy.cuda.Device(device).pci_bus_id)
    except Exception:  # noqa: BLE001 - no bus id from this CuPy or driver: identity unknown
        bus = None
    return identity_of(bus, device)


def identity_of(bus: str | None, device: int) -> str:
    """``host|bus`` for a known PCI bus id. Without one the GPU is unknown, and the
    identity names this process instead: a device index means different GPUs under
    different CUDA_VISIBLE_DEVICES, so two ranks must not be refused on it; such a GPU is
    left out of the one-GPU-per-rank check (NCCL's own check still runs)."""
    if bus is not None:
        return f"{host_id()}|{bus}"
    log.debug("nccl: no PCI bus id for cuda:%d in pid %d; the one-GPU-per-rank check skips it",
              device, os.getpid())
    return f"{host_id()}|unknown GPU cuda:{device} of pid {os.getpid()}"


def shared_gpus(identities: Sequence[Sequence[str]]) -> dict[str, list[int]]:
    """GPU identity -> the ranks using it, for every GPU that more than one rank uses
    (``identities[r]``: the GPUs of rank r; one rank listing a GPU twice counts too)."""
    users: dict[str, list[int]] = {}
    for rank, gpus in enumerate(identities):
        for gpu in gpus:
            users.setdefault(gpu, []).append(rank)
    return {gpu: ranks for gpu, ranks in users.items() if len(ranks) > 1}


def check_in_gpus(store: Any, key: str, rank: int, size: int, gpus: Sequence[str], timeout: float) -> list[list[str]]:
    """:func:`check_in` of this rank's GPU identities; returns every rank's."""
    return [v.split("\n") for v in check_in(store, key, rank, size, "\n".join(gpus), timeout)]


def refuse_shared_gpus(identities: Sequence[Sequence[str]]) -> None:
    """InvalidArgumentError, naming the ranks and the GPU, when two ranks (or two devices of
    one rank) are one GPU."""
    shared = shared_gpus(identities)
    if shared:
        gpu, ranks = next(iter(shared.items()))
        host, _, bus = gpu.partition("|")
        raise InvalidArgumentError(
            f"backend 'nccl': ranks {ranks} of this group use the same GPU ({bus} on host "
            f"{host.split('/')[0]}); NCCL needs one GPU per rank. Give each process its own "
            f"GPU (CUDA_VISIBLE_DEVICES, or cupy.cuda.Device(local_rank).use()), or use the "
            f"tcp or gloo backend, which move CuPy arrays between processes sharing a GPU"
        )


def create_communicator(store: Any, key: str, rank: int, size: int, device: int, timeout: float) -> Any:
    """One NcclCommunicator for this process's ``device``; collective over the group."""
    import cupy
    from cupy.cuda import nccl

    raw = exchange_unique_id(store, f"{key}/uid", rank, timeout)
    refuse_shared_gpus(check_in_gpus(store, f"{key}/in", rank, size, [gpu_identity(device)], timeout))
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
    identities = check_in_gpus(store, f"{key}/in", rank, size, [gpu_identity(d) for d in devices], timeout)
    counts = [len(i) for i in identities]
    if any(c != ndev for c in counts):
        raise InvalidArgumentError(
            f"*_multigpu: every process must pass the same number of GPUs; the group's "
            f"processes pass {counts}"
        )
    refuse_shared_gpus(identities)
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
    "check_in_gpus",
    "close_communicator",
    "create_communicator",
    "create_multi_communicators",
    "exchange_unique_id",
    "gpu_identity",
    "host_id",
    "identity_of",
    "refuse_shared_gpus",
    "shared_gpus",
    "uid_for_cupy",
    "uid_to_bytes",
]
