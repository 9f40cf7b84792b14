"""What a plugin registers: BackendSpec records, returned by the ``procgroup_backends`` hook.

Hooks only *register* things; they never carry traffic. A plugin module (the target of
an entry point in group ``procgroup``) implements the hooks it needs::

    from procgroup.backend import BackendSpec, hookimpl

    @hookimpl
    def procgroup_backends():
        return [BackendSpec(name="mine", loader=_load, devices=("cpu",))]

Heavy imports (mpi4py, pygloo, cupy) belong inside ``loader`` and ``unavailable`` so
that listing backends stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Mapping

import pluggy

if TYPE_CHECKING:
    from ._channel import DataChannel

PROJECT = "procgroup"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


def _runs_everywhere() -> str | None:
    return None


def _no_detail() -> str | None:
    return None


@dataclass(frozen=True)
class BackendSpec:
    """What a plugin says about one backend; frozen so the registry can hand it out."""

    name: str
    #: Returns the DataChannel subclass; called once, at init_process_group.
    loader: Callable[[], type[DataChannel]]
    #: Devices whose arrays the channel takes directly ("cpu", "cuda"). CUDA arrays given
    #: to a cpu-only backend are staged through host memory by the core.
    devices: tuple[str, ...] = ("cpu",)
    #: Returns None when the backend can run here, else the reason it cannot.
    unavailable: Callable[[], str | None] = _runs_everywhere
    description: str = ""
    #: One line ``python -m procgroup info`` prints under an available backend, e.g.
    #: which engine runs it and why (gloo: pygloo or torch); None prints nothing.
    detail: Callable[[], str | None] = _no_detail
    #: > 0: the backend can serve as the host side channel of other backends (a CPU
    #: point-to-point channel over any members of a Store); the highest wins.
    side_channel: int = 0
    #: True when every byte the channel receives came over connections that passed the
    #: job-token handshake (or memory only such peers share). Object collectives unpickle
    #: on such a group directly; on any other they run over an authenticated host side
    #: group, so a stranger who reaches the backend's own transport cannot feed a pickle.
    authenticated: bool = False
    #: Extra public functions the plugin adds to ``procgroup`` (name -> function),
    #: looked up when ``procgroup.<name>`` is not a core name (e.g. nccl's ``*_multigpu``).
    api: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    #: Filled in by the registry: the distribution that provides the plugin.
    distribution: str = field(default="", compare=False)


@dataclass(frozen=True)
class InitMethodSpec:
    """An extra rendezvous URL scheme, e.g. ``etcd``; handler as in procgroup.rendezvous."""

    scheme: str
    handler: Callable[..., object]


__all__ = ["BackendSpec", "InitMethodSpec", "PROJECT", "hookimpl", "hookspec"]
