"""Entry point of the nccl backend: registers it with procgroup's plugin manager.

Nothing here imports CuPy; the availability check and the loader do, when called. The
multi-GPU calls are published as ``procgroup.all_reduce_multigpu`` etc. (BackendSpec.api).
"""

from __future__ import annotations

from procgroup.backend import BackendSpec, hookimpl

from .multigpu import (
    all_gather_multigpu,
    all_reduce_multigpu,
    broadcast_multigpu,
    reduce_multigpu,
)


def _load() -> type:
    from .channel import NcclChannel

    return NcclChannel


def _available() -> str | None:
    from ._availability import unavailable_reason

    return unavailable_reason()


@hookimpl
def procgroup_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="nccl",
            loader=_load,
            devices=("cuda",),
            unavailable=_available,
            description="NVIDIA NCCL through CuPy: CUDA arrays only, one GPU per process "
            "(several with the *_multigpu calls)",
            api={f.__name__: f for f in (all_gather_multigpu, all_reduce_multigpu, broadcast_multigpu,
                                         reduce_multigpu)},
        )
    ]
