"""HashStore: an in-process, thread-safe Store (threads of one process, tests)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from procgroup.errors import StoreTimeoutError

from ._store import (
    DEFAULT_TIMEOUT,
    Store,
    check_key,
    check_keys,
    check_timeout,
    compare_set_value,
    parse_counter,
    to_bytes,
)

logger = logging.getLogger(__name__)


class HashStore(Store):
    """A dict behind a condition variable; waits sleep until a key is set."""

    _closed = True  # until __init__ finishes

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = check_timeout(timeout, DEFAULT_TIMEOUT)
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False

    def set(self, key: str, value: bytes | str) -> None:
        key, raw = check_key(key), to_bytes(value)
        with self._cond:
            self._check_open(self._closed)
            self._data[key] = raw
            self._cond.notify_all()

    def get(self, key: str, timeout: float | None = None) -> bytes:
        key = check_key(key)
        self.wait([key], timeout)
        with self._cond:
            self._check_open(self._closed)
            return self._data[key]

    def add(self, key: str, amount: int = 1) -> int:
        key = check_key(key)
        with self._cond:
            self._check_open(self._closed)
            old = self._data.get(key)
            value = (parse_counter(key, old) if old is not None else 0) + int(amount)
            self._data[key] = str(value).encode("ascii")
            self._cond.notify_all()
            return value

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        keys = check_keys(keys)
        timeout = check_timeout(timeout, self.timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._check_open(self._closed)
                missing = [k for k in keys if k not in self._data]
                if not missing:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeoutError(
                        f"HashStore: timed out after {timeout:g}s waiting for keys {missing}",
                        op="wait",
                    )
                self._cond.wait(left)

    def check(self, keys: Sequence[str]) -> bool:
        keys = check_keys(keys)
        with self._cond:
            self._check_open(self._closed)
            return all(k in self._data for k in keys)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        key = check_key(key)
        exp, des = to_bytes(expected, "expected"), to_bytes(desired, "desired")
        with self._cond:
            self._check_open(self._closed)
            value, changed = compare_set_value(self._data.get(key), exp, des)
            if changed:
                self._data[key] = value
                self._cond.notify_all()
            return value

    def delete_key(self, key: str) -> bool:
        key = check_key(key)
        with self._cond:
            self._check_open(self._closed)
            return self._data.pop(key, None) is not None

    def num_keys(self) -> int:
        with self._cond:
            self._check_open(self._closed)
            return len(self._data)

    def close(self) -> None:
        cond = getattr(self, "_cond", None)
        if cond is None:
            return
        with cond:
            self._closed = True
            cond.notify_all()  # waiters see the store closed and raise StoreError
