"""The worker's caching allocator for large host arrays (PyTorch's CUDA caching allocator
is the model).

Why: a fresh large array costs the first touch of its pages (page faults and the kernel's
zeroing), as much as a whole shared-memory copy of it. When the master drops a RemoteArray, its block therefore stays mapped here,
in a bounded cache keyed by size class, and the next array of that class (a ``.to()``
receive, ``remote.send``'s receive, ``remote.empty/zeros/ones/full``) takes it warm.

Safety: a block may be handed out again only once nothing on the worker still reads or
writes its memory. Every array made from a block is a view of a per-allocation
:class:`_Owner`: a small object that is *not* an ndarray and exposes the block through
``__array_interface__``. NumPy keeps a reference from each view to the object its data
came from (``.base`` chains collapse only through ndarrays that do not own their data
and stop at the first object that is not an ndarray), so the owner stays alive while
anything holds the memory through a Python reference: views made on the worker
(reshape, slicing, ``.T``, ``view``), a memoryview or buffer export (it holds its
array), an array a ``remote.run`` function kept, a command still queued on any stream
(its job holds the slot), a transfer in flight (the transports hold the array or a
memoryview of it until the send or receive completed). The owner's ``__del__`` runs
when the last of them is gone, which is the moment NumPy would have returned the memory
to malloc, and only then does the block go back to the cache. So the cache is exactly as
safe as NumPy's own free: what is correct with the memory given back to the OS is
correct here; only a raw address kept without a reference (a ctypes pointer) is not
tracked, and that would be a use after free with NumPy too.

The price: an array from the cache does not own its data (``flags.owndata`` is False,
``ndarray.resize`` in place refuses), as any view.

``PROCGROUP_REMOTE_CACHE_BYTES`` bounds the bytes of free blocks a worker keeps (default
:data:`DEFAULT_LIMIT`; 0 disables the cache: every array comes from NumPy, as before);
when a returning block would exceed it, the blocks cached longest go first. Only arrays
of at least :data:`MIN_BYTES` go through the cache (smaller ones are cheap from malloc's
own free lists), and only host arrays: CuPy has a memory pool of its own.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

import numpy as np

from .._settings import env_bytes

log = logging.getLogger(__name__)

#: the setting that bounds the cached (free) bytes of one worker; 0 disables the cache
ENV_CACHE_BYTES = "PROCGROUP_REMOTE_CACHE_BYTES"
#: its default: a few large arrays' worth, a small part of a worker machine's memory
DEFAULT_LIMIT = 512 << 20
#: arrays smaller than this come from NumPy directly
MIN_BYTES = 1 << 20


def cache_limit() -> int:
    """$PROCGROUP_REMOTE_CACHE_BYTES, else :data:`DEFAULT_LIMIT` (InvalidArgumentError
    for anything but a whole number >= 0)."""
    limit = env_bytes(ENV_CACHE_BYTES, DEFAULT_LIMIT, hint="0 disables the cache")
    return DEFAULT_LIMIT if limit is None else limit


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of 8 classes per power of two (at most 12.5% more),
    so arrays of nearly the same size share blocks."""
    step = 1 << max(12, nbytes.bit_length() - 4)
    return (nbytes + step - 1) & -step


class _Owner:
    """The NumPy base of every array made from one allocation of a block: while it lives,
    something may still use the block; its death returns the block to the cache."""

    __slots__ = ("__array_interface__", "block", "home")

    def __init__(self, home: collections.deque[np.ndarray], block: np.ndarray, nbytes: int) -> None:
        self.block = block
        self.home = home
        self.__array_interface__ = {"data": (block.__array_interface__["data"][0], False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        # any thread may drop the last view: only queue it (deque.append is atomic); the
        # cache files it under its lock at its next call
        self.home.append(self.block)


class HostCache:
    """Free blocks by size class, at most ``limit`` bytes of them, oldest evicted first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}  # size class -> free blocks, last in first out
        self._order: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # id -> block, oldest first
        self._returned: collections.deque[np.ndarray] = collections.deque()  # from dying owners, not filed yet
        self._bytes = 0

    def takes(self, nbytes: int, dtype: np.dtype) -> bool:
        """Whether an array of ``nbytes`` bytes of ``dtype`` goes through the cache."""
        return MIN_BYTES <= nbytes and size_class(nbytes) <= self.limit and not dtype.hasobject

    def empty(self, shape: tuple[int, ...], dtype: Any, *, zero: bool = False) -> np.ndarray:
        """A C-contiguous array (zero-filled with ``zero``), from the cache when it takes
        that size; from NumPy otherwise."""
        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in shape)
        nbytes = dt.itemsize
        for d in shape:
            nbytes *= d
        if not self.takes(nbytes, dt):
            return np.zeros(shape, dt) if zero else np.empty(shape, dt)
        cls = size_class(nbytes)
        with self._lock:
            self._file_returned()
            bucket = self._free.get(cls)
            block = bucket.pop() if bucket else None
            if block is not None:
                del self._order[id(block)]
                self._bytes -= cls
        warm = block is not None
        if block is None:  # a miss: np.zeros' pages come zeroed from the kernel, untouched
            block = np.zeros(cls, np.uint8) if zero else np.empty(cls, np.uint8)
        flat = np.asarray(_Owner(self._returned, block, nbytes))
        if zero and warm:
            flat.fill(0)
        return flat.view(dt).reshape(shape)

    def collect(self) -> None:
        """File the blocks returned since the last call (after frees: the limit holds at
        once, not only at the next allocation)."""
        if self._returned:
            with self._lock:
                self._file_returned()

    def cached_bytes(self) -> int:
        """Bytes of the free blocks held now (size classes, not counted in memory_info's
        "bytes")."""
        with self._lock:
            self._file_returned()
            return self._bytes

    def release(self) -> int:
        """Drop every free block (remote.empty_cache); the bytes given back."""
        with self._lock:
            self._file_returned()
            freed = self._bytes
            self._free.clear()
            self._order.clear()
            self._bytes = 0
        log.debug("procgroup.remote cache: released %d bytes", freed)
        return freed

    def _file_returned(self) -> None:
        """Move blocks whose owner died into the free lists, evicting the oldest past the
        limit (under the lock)."""
        returned = self._returned
        while returned:
            block = returned.popleft()
            cls = block.nbytes
            if cls > self.limit:
                continue
            self._free.setdefault(cls, []).append(block)
            self._order[id(block)] = block
            self._bytes += cls
            while self._bytes > self.limit:
                _, old = self._order.popitem(last=False)
                old_cls = old.nbytes
                bucket = self._free[old_cls]
                del bucket[next(i for i, b in enumerate(bucket) if b is old)]  # by identity, not ==
                self._bytes -= old_cls
                log.debug("procgroup.remote cache: evicted a block of %d bytes (limit %d)", old_cls, self.limit)


__all__ = ["DEFAULT_LIMIT", "ENV_CACHE_BYTES", "MIN_BYTES", "HostCache", "cache_limit", "size_class"]
