"""Entry point of the mpi backend: registers it without importing mpi4py.

``from mpi4py import MPI`` initialises MPI, so it happens only in the loader (at
init_process_group), never while backends are merely listed.
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
