"""Entry point of the mpi backend: registers it without importing mpi4py.

mpi4py is imported only by the loader; even then MPI is not initialised until the
channel is used (``channel._initialized``: discover_world, discover_store, the
constructor), so ``python -m procgroup info`` can load the class and list its ops
without starting MPI.
"""

from __future__ import annotations

import importlib.util

from procgroup.backend import BackendSpec, DataChannel, hookimpl


def _load() -> type[DataChannel]:
    from .channel import MpiChannel

    return MpiChannel


def _unavailable() -> str | None:
    """Why the backend cannot run here, or None; cheap: finds mpi4py without importing MPI."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install 'procgroup-mpi[mpich]')"
    return None


@hookimpl
def procgroup_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="mpi",
            loader=_load,
            # A CUDA-aware MPI adds "cuda" on the channel instance (MpiChannel.devices).
            devices=("cpu",),
            unavailable=_unavailable,
            description="MPI via mpi4py: native collectives; ranks found from mpiexec",
        )
    ]


__all__ = ["procgroup_backends"]
