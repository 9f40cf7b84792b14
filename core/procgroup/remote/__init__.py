"""procgroup.remote: master-worker mode, NumPy/CuPy arrays on worker nodes driven from
one program (docs/master-worker.md).

``procgroup.init_master_worker(...)`` makes rank 0 the master; every other rank serves it
as node ``rank - 1``. Arrays made here (``remote.zeros(...)``, ``remote.send(ndarray)``)
live on the current node; operations on them are issued asynchronously, run in order per
stream on the worker, and the master waits only at get()/np.asarray/float/int/bool and
the synchronizations. Under asyncio, ``await x.get_async()``, ``await
synchronize_async()`` and the streams' and events' ``synchronize_async()`` wait without
blocking the event loop.
"""

from ._api import (
    Event,
    Stream,
    all_reduce,
    arange,
    broadcast,
    current_node,
    current_stream,
    default_stream,
    empty,
    empty_cache,
    empty_like,
    full,
    full_like,
    init_master_worker,
    memory_info,
    node,
    num_nodes,
    ones,
    ones_like,
    run,
    run_async,
    send,
    set_node,
    synchronize,
    synchronize_async,
    zeros,
    zeros_like,
)
from ._array import FUNCTIONS, RemoteArray, RemoteValue

#: The NumPy functions RemoteArray implements through __array_function__ (ufuncs all go
#: through __array_ufunc__); anything else raises TypeError naming this list.
SUPPORTED_FUNCTIONS = tuple(sorted(f.__name__ for f in FUNCTIONS))

__all__ = [
    "SUPPORTED_FUNCTIONS",
    "Event",
    "RemoteArray",
    "RemoteValue",
    "Stream",
    "all_reduce",
    "arange",
    "broadcast",
    "current_node",
    "current_stream",
    "default_stream",
    "empty",
    "empty_cache",
    "empty_like",
    "full",
    "full_like",
    "init_master_worker",
    "memory_info",
    "node",
    "num_nodes",
    "ones",
    "ones_like",
    "run",
    "run_async",
    "send",
    "set_node",
    "synchronize",
    "synchronize_async",
    "zeros",
    "zeros_like",
]
