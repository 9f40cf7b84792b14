"""Entry point of the tcp backend: registers it with procgroup's plugin manager."""

from __future__ import annotations

from procgroup.hookspecs import BackendSpec, hookimpl


def _load() -> type:
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
        )
    ]
