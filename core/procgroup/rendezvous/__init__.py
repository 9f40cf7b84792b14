"""Rendezvous: init-method URLs (env://, tcp://, file://, multicast) and key-value Stores.

``rendezvous(init_method, rank=..., world_size=..., group_name=..., timeout=...)``
brings the processes of a job together and returns a :class:`RendezvousResult` with
the job's :class:`Store`; backends exchange their addresses through that store.
"""

from ._file import FileStore
from ._hash import HashStore
from ._methods import register_init_method, rendezvous
from ._prefix import PrefixStore
from ._result import RendezvousResult
from ._store import Store
from ._tcp import TCPStore

__all__ = [
    "FileStore",
    "HashStore",
    "PrefixStore",
    "RendezvousResult",
    "Store",
    "TCPStore",
    "register_init_method",
    "rendezvous",
]
