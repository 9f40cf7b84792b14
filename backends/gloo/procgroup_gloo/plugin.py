"""Entry point of the gloo backend: registers it without importing pygloo.

Listing backends must stay cheap and must not fail where pygloo cannot be installed
(it has wheels only for CPython 3.8-3.10 on x86-64 Linux), so availability is checked
with ``importlib.util.find_spec`` and reported as a reason, not an ImportError.
"""

from __future__ import annotations

import importlib.util
import platform
import sys

from procgroup.backend import BackendSpec, hookimpl

SUPPORTED = "pygloo publishes wheels only for CPython 3.8-3.10 on x86-64 Linux"


def _load() -> type:
    from .channel import GlooChannel

    return GlooChannel


def unavailable_reason() -> str | None:
    """None when pygloo can be imported here, else why the gloo backend cannot run."""
    try:
        found = importlib.util.find_spec("pygloo") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    here = (
        f"{platform.python_implementation()} {sys.version_info.major}.{sys.version_info.minor} "
        f"on {sys.platform}/{platform.machine()}"
    )
    return f"pygloo is not installed ({SUPPORTED}; this is {here}); pip install pygloo"


@hookimpl
def procgroup_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            name="gloo",
            loader=_load,
            devices=("cpu",),
            unavailable=unavailable_reason,
            description="gloo collectives through pygloo (ring/bcube all_reduce); p2p over a host side channel (tcp)",
        )
    ]
