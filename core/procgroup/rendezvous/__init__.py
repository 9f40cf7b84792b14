"""Rendezvous: init-method URLs (env://, tcp://, file://, multicast) and key-value Stores."""

from ._store import Store
from ._hash import HashStore
from ._prefix import PrefixStore
from ._tcp import TCPStore
from ._file import FileStore

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore"]
