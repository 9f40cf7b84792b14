"""Entry point of the gloo backend: registers it without importing pygloo or torch.

Listing backends must stay cheap and must not fail where no engine can be installed
(pygloo has wheels only for CPython 3.8-3.10 on x86-64 Linux; torch is an extra), so
availability is checked with ``importlib.util.find_spec`` and reported as a reason,
not an ImportError; ``python -m procgroup info`` also says which engine runs and why.
"""

from __future__ import annotations

from procgroup.backend import BackendSpec, hookimpl

from ._engine import describe, unavailable_reason


def _load() -> type:
    from .channel import GlooChannel

    return GlooChannel


@hookimpl
def procgroup_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="gloo",
            loader=_load,
            devices=("cpu",),
            unavailable=unavailable_reason,
            detail=describe,
            description="gloo collectives through pygloo or torch's ProcessGroupGloo; p2p over a host "
                        "side channel (tcp)",
        )
    ]
