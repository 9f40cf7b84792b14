"""The Store interface shared by every key-value store.

Backends exchange addresses and ids through a Store during init, so the interface is
small and the same for every implementation (TCP, file, in-process, prefixed).
"""

from __future__ import annotations

import abc
import logging
import math
from collections.abc import Sequence

from procgroup._settings import MAX_TIMEOUT_S
from procgroup.errors import InvalidArgumentError, StoreError

logger = logging.getLogger(__name__)

#: Default seconds a blocking Store call waits (torch.distributed's default is 300 s).
DEFAULT_TIMEOUT = 300.0


def to_bytes(value: bytes | bytearray | memoryview | str, what: str = "value") -> bytes:
    """Normalise a value to bytes: str is UTF-8 encoded, buffers are copied."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgumentError(
        f"Store {what} must be bytes or str, got {type(value).__name__}"
    )


def check_key(key: str) -> str:
    """Reject non-str and empty keys early, before anything is sent."""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"Store key must be str, got {type(key).__name__}")
    if not key:
        raise InvalidArgumentError("Store key must not be empty")
    return key


def check_keys(keys: Sequence[str]) -> list[str]:
    """Validate a sequence of keys (a lone str is refused: it would be split in chars)."""
    if isinstance(keys, (str, bytes)):
        raise InvalidArgumentError(
            f"Store keys must be a sequence of str, got a single {type(keys).__name__} "
            f"{keys!r}; wrap it in a list"
        )
    return [check_key(k) for k in keys]


def check_timeout(timeout: float | None, default: float) -> float:
    """Resolve ``None`` to the store default and refuse negative/NaN timeouts."""
    if timeout is None:
        timeout = default
    if hasattr(timeout, "total_seconds"):  # datetime.timedelta
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgumentError(
            f"Store timeout must be a number of seconds, got {type(timeout).__name__}"
        )
    timeout = float(timeout)
    if not math.isfinite(timeout) or not 0 <= timeout <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(
            f"Store timeout must be a finite number of seconds in 0..{MAX_TIMEOUT_S:g}, got {timeout}")
    return timeout


def parse_counter(key: str, raw: bytes) -> int:
    """Read a counter written by ``add`` (decimal ASCII, as torch.distributed stores it)."""
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidArgumentError(
            f"Store.add: key {key!r} holds {raw[:40]!r}, which is not an integer counter"
        ) from None


def compare_set_value(
    current: bytes | None, expected: bytes, desired: bytes
) -> tuple[bytes, bool]:
    """torch semantics of compare_set; returns (value now stored, whether it changed)."""
    if current is None:
        if expected == b"":
            return desired, True
        return expected, False
    if current == expected:
        return desired, True
    return current, False


class Store(abc.ABC):
    """Key-value store the ranks share; backends exchange addresses/ids through it.

    Keys are ``str``; values are ``bytes`` (``str`` values are stored UTF-8 encoded).
    Every blocking call takes a timeout in seconds; ``None`` means :attr:`timeout`.
    """

    timeout: float = DEFAULT_TIMEOUT

    @abc.abstractmethod
    def set(self, key: str, value: bytes | str) -> None:
        """Store ``value`` under ``key``, replacing what was there, and wake waiters."""

    @abc.abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """Return the value of ``key``, waiting until some rank sets it."""

    @abc.abstractmethod
    def add(self, key: str, amount: int = 1) -> int:
        """Atomically add ``amount`` to the counter ``key`` (missing counts as 0)."""

    @abc.abstractmethod
    def wait(self, keys: Sequence[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` exists; StoreTimeoutError names the missing."""

    @abc.abstractmethod
    def check(self, keys: Sequence[str]) -> bool:
        """True if every key exists right now (no waiting)."""

    @abc.abstractmethod
    def compare_set(
        self, key: str, expected: bytes | str, desired: bytes | str
    ) -> bytes:
        """Set ``desired`` if the value equals ``expected`` (missing key: ``b""``).

        Returns the value stored afterwards, as torch.distributed does.
        """

    @abc.abstractmethod
    def delete_key(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    @abc.abstractmethod
    def num_keys(self) -> int:
        """Number of keys stored (counters included)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release sockets/files; safe to call twice."""

    def _check_open(self, closed: bool) -> None:
        if closed:
            raise StoreError(f"{type(self).__name__} is closed")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; never raise from a finaliser
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass
