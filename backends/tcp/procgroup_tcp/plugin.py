"""Entry point of the tcp backend: registers it with procgroup's plugin manager.

``side_channel=100``: the registry picks tcp as the host side channel of backends
that need one (gloo's point-to-point, the object collectives of gloo, mpi and nccl).
``authenticated=True``: its connections pass the job-token handshake, so object
collectives may unpickle what arrives on it.
"""

from __future__ import annotations

from procgroup.backend import BackendSpec, DataChannel, hookimpl


def _load() -> type[DataChannel]:
    from .channel import TcpChannel

    return TcpChannel


@hookimpl
def procgroup_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="tcp",
            loader=_load,
            devices=("cpu",),
            description="TCP sockets, one connection per peer pair; no extra dependencies",
            side_channel=100,
            authenticated=True,  # every connection starts with the job-token handshake
        )
    ]


__all__ = ["procgroup_backends"]
