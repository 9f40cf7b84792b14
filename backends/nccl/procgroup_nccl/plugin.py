"""Entry point of the nccl backend: registers it with procgroup's plugin manager.

Nothing here imports CuPy; the availability check and the loader do, when called.
"""

from __future__ import annotations

from procgroup.hookspecs import BackendSpec, hookimpl


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
            available=_available,
            description="NVIDIA NCCL through CuPy: CUDA arrays only, one GPU per process "
            "(several with the *_multigpu calls)",
        )
    ]
