"""PrefixStore: a namespace inside another Store (one per group or job)."""

from __future__ import annotations

from collections.abc import Sequence

from procgroup.errors import InvalidArgumentError, StoreTimeoutError

from ._store import Store, check_key, check_keys


class PrefixStore(Store):
    """Every key becomes ``"prefix/key"`` in the wrapped store.

    ``close()`` closes the wrapped store only when ``owns_store=True`` (rendezvous
    hands out such a store); otherwise several PrefixStores can share one store.
    ``num_keys()`` counts the wrapped store's keys (all prefixes).
    """

    _closed = True

    def __init__(self, prefix: str, store: Store, *, owns_store: bool = False) -> None:
        if not isinstance(prefix, str):
            raise InvalidArgumentError(
                f"PrefixStore prefix must be str, got {type(prefix).__name__}"
            )
        if not isinstance(store, Store):
            raise InvalidArgumentError(
                f"PrefixStore needs a procgroup Store, got {type(store).__name__}"
            )
        self.prefix = prefix
        self.store = store
        self._owns = owns_store
        self._timeout: float | None = None
        self._closed = False

    @property
    def timeout(self) -> float:  # a property here: it follows the wrapped store
        """Default wait; follows the wrapped store until set here."""
        return self.store.timeout if self._timeout is None else self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = float(value)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}"

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    def set(self, key: str, value: bytes | str) -> None:
        self._check_open(self._closed)
        self.store.set(self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self._check_open(self._closed)
        try:
            return self.store.get(self._k(key), self._t(timeout))
        except StoreTimeoutError as exc:
            raise StoreTimeoutError(self._strip(str(exc)), op=exc.op) from None

    def add(self, key: str, amount: int = 1) -> int:
        self._check_open(self._closed)
        return self.store.add(self._k(key), amount)

    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        self._check_open(self._closed)
        full = [self._k(k) for k in check_keys(keys)]
        try:
            self.store.wait(full, self._t(timeout))
        except StoreTimeoutError as exc:
            raise StoreTimeoutError(self._strip(str(exc)), op=exc.op) from None

    def _strip(self, message: str) -> str:
        """Say which prefix the keys were under, so the message names the real keys."""
        return f"{message} (under prefix {self.prefix!r})"

    def check(self, keys: Sequence[str]) -> bool:
        self._check_open(self._closed)
        return self.store.check([self._k(k) for k in check_keys(keys)])

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        self._check_open(self._closed)
        return self.store.compare_set(self._k(key), expected, desired)

    def delete_key(self, key: str) -> bool:
        self._check_open(self._closed)
        return self.store.delete_key(self._k(key))

    def num_keys(self) -> int:
        self._check_open(self._closed)
        return self.store.num_keys()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns:
            self.store.close()

    def __repr__(self) -> str:
        return f"PrefixStore({self.prefix!r}, {self.store!r})"
