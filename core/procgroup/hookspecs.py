"""pluggy hook specifications: the contract a procgroup plugin implements.

Hooks only *register* things; they never carry traffic. A plugin module (the target
of an entry point in group ``procgroup``) implements one or both hooks::

    from procgroup.hookspecs import BackendSpec, hookimpl

    @hookimpl
    def procgroup_backends():
        return [BackendSpec(name="tcp", loader=_load, devices=("cpu",))]

Heavy imports (mpi4py, pygloo, cupy) belong inside ``loader`` and ``available`` so that
listing backends stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import pluggy

if TYPE_CHECKING:
    from .channel import DataChannel

PROJECT = "procgroup"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


def _always_available() -> str | None:
    return None


@dataclass(frozen=True)
class BackendSpec:
    """What a plugin says about one backend; frozen so the registry can hand it out."""

    name: str
    #: Returns the DataChannel subclass; called once, at init_process_group.
    loader: Callable[[], "type[DataChannel]"]
    #: Devices whose arrays the channel takes directly ("cpu", "cuda"). CUDA arrays given
    #: to a cpu-only backend are staged through host memory by the core.
    devices: tuple[str, ...] = ("cpu",)
    #: Returns None when the backend can run here, else the reason it cannot.
    available: Callable[[], str | None] = _always_available
    description: str = ""
    #: Filled in by the registry: the distribution that provides the plugin.
    distribution: str = field(default="", compare=False)


@dataclass(frozen=True)
class InitMethodSpec:
    """An extra rendezvous URL scheme, e.g. ``etcd``; handler as in procgroup.rendezvous."""

    scheme: str
    handler: Callable[..., object]


class ProcGroupHookSpecs:
    """The hooks a procgroup plugin may implement."""

    @hookspec
    def procgroup_backends(self) -> Sequence[BackendSpec]:
        """Return the backends this plugin provides."""
        raise NotImplementedError

    @hookspec
    def procgroup_init_methods(self) -> Sequence[InitMethodSpec] | Mapping[str, Callable[..., object]]:
        """Return extra init-method URL schemes (spec records, or a scheme -> handler map)."""
        raise NotImplementedError


__all__ = ["BackendSpec", "InitMethodSpec", "ProcGroupHookSpecs", "hookimpl", "hookspec"]
