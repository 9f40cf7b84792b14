"""procgroup: MPI-like process groups for Python arrays, with pluggable transports.

Processes join a process group with :func:`init_process_group`, get a rank, and move
NumPy/CuPy arrays (or anything with the buffer protocol, ``__cuda_array_interface__``
or DLPack) with point-to-point calls and collectives. Transports are DataChannel
plugins (tcp, mpi, gloo, nccl, or a third party's) found through entry points.
"""

from ._lifecycle import (
    Backend,
    destroy_process_group,
    get_backend,
    get_num_processes,
    get_rank,
    get_world_size,
    group_channel,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
)
from ._ops import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
)
from ._survive import agree, failed_ranks, revoke, shrink
from .backend import BackendSpec, ChannelContext, DataChannel, Work, hookimpl
from .errors import (
    AuthenticationError,
    ChannelClosedError,
    CommTimeoutError,
    GroupRevokedError,
    InvalidArgumentError,
    InvalidArrayError,
    MismatchError,
    PeerError,
    ProcGroupError,
    RemoteError,
)
from .groups import Group, GroupMember, group
from .objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from .ops import ReduceOp, reduce_op
from .plugins import register_backend
from . import remote
from .remote import (
    Event,
    Stream,
    current_node,
    init_master_worker,
    node,
    num_nodes,
    set_node,
    synchronize,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """Functions a plugin adds (BackendSpec.api), e.g. nccl's all_reduce_multigpu."""
    from .plugins import api_function

    found = api_function(name)
    if found is not None:
        return found
    hint = " (it comes with the nccl backend: pip install procgroup-nccl)" if name.endswith("_multigpu") else ""
    raise AttributeError(f"module 'procgroup' has no attribute {name!r}{hint}")


__all__ = [
    "AuthenticationError",
    "Backend",
    "Event",
    "BackendSpec",
    "ChannelClosedError",
    "ChannelContext",
    "CommTimeoutError",
    "DataChannel",
    "Group",
    "GroupRevokedError",
    "GroupMember",
    "InvalidArgumentError",
    "InvalidArrayError",
    "MismatchError",
    "PeerError",
    "ProcGroupError",
    "ReduceOp",
    "RemoteError",
    "Stream",
    "Work",
    "__version__",
    "agree",
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "current_node",
    "destroy_process_group",
    "failed_ranks",
    "gather",
    "gather_object",
    "get_backend",
    "get_num_processes",
    "get_rank",
    "get_world_size",
    "group",
    "group_channel",
    "hookimpl",
    "init_master_worker",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "new_group",
    "node",
    "num_nodes",
    "recv",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "register_backend",
    "scatter",
    "scatter_object_list",
    "remote",
    "revoke",
    "send",
    "set_node",
    "shrink",
    "synchronize",
]
