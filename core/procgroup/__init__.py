"""procgroup: MPI-like process groups for Python arrays, with pluggable transports.

Processes join a process group with :func:`init_process_group`, get a rank, and move
NumPy/CuPy arrays (or anything with the buffer protocol, ``__cuda_array_interface__``
or DLPack) with point-to-point calls and collectives. Transports are DataChannel
plugins (tcp, mpi, gloo, nccl, or a third party's) found through entry points.
"""

from ._api import (
    Backend,
    GroupMember,
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    destroy_process_group,
    gather,
    get_backend,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_available,
    is_initialized,
    isend,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    scatter,
    send,
)
from .channel import ChannelContext, DataChannel, Work
from .groups import Group
from .hookspecs import BackendSpec, hookimpl
from .objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from .ops import ReduceOp, reduce_op
from .plugins import register_backend

__version__ = "0.1.0"

#: torch.distributed's list variants for one process driving several GPUs; they live in
#: the nccl plugin and are imported from there on first use.
_MULTIGPU = ("all_gather_multigpu", "all_reduce_multigpu", "broadcast_multigpu", "reduce_multigpu")


def __getattr__(name: str) -> object:
    if name in _MULTIGPU:
        try:
            import procgroup_nccl
        except ImportError:
            raise AttributeError(
                f"procgroup.{name} needs the nccl backend: pip install procgroup-nccl"
            ) from None
        return getattr(procgroup_nccl, name)
    raise AttributeError(f"module 'procgroup' has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendSpec",
    "ChannelContext",
    "DataChannel",
    "Group",
    "GroupMember",
    "ReduceOp",
    "Work",
    "__version__",
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_rank",
    "get_world_size",
    "group",
    "hookimpl",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "register_backend",
    "scatter",
    "scatter_object_list",
    "send",
]
