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
    is_available,
    is_initialized,
)
from ._ops import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    failure_ack,
    failure_get_acked,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
)
from ._collectives_ext import all_gather_into_tensor, all_to_all_single, reduce_scatter_tensor
from ._monitored import monitored_barrier
from ._flight import dump_flight_record, flight_record, flight_report
from ._p2p_batch import P2POp, batch_isend_irecv
from ._torch2017 import gather_recv, gather_send, scatter_recv, scatter_send
from ._torch_groups import (
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_process_group_ranks,
    init_process_group,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
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
from .objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
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
    "BackendSpec",
    "ChannelClosedError",
    "ChannelContext",
    "CommTimeoutError",
    "DataChannel",
    "Event",
    "Group",
    "GroupMember",
    "GroupRevokedError",
    "InvalidArgumentError",
    "InvalidArrayError",
    "MismatchError",
    "P2POp",
    "PeerError",
    "ProcGroupError",
    "ReduceOp",
    "RemoteError",
    "Stream",
    "Work",
    "__version__",
    "agree",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "current_node",
    "destroy_process_group",
    "failed_ranks",
    "failure_ack",
    "failure_get_acked",
    "gather",
    "gather_object",
    "gather_recv",
    "gather_send",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_num_processes",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "group_channel",
    "hookimpl",
    "init_master_worker",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "isend",
    "monitored_barrier",
    "dump_flight_record",
    "flight_record",
    "flight_report",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "node",
    "num_nodes",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "register_backend",
    "remote",
    "revoke",
    "scatter",
    "scatter_object_list",
    "scatter_recv",
    "scatter_send",
    "send",
    "send_object_list",
    "set_node",
    "shrink",
    "synchronize",
]
