"""pluggy hook specifications: the contract a procgroup plugin implements.

Hooks only *register* things; they never carry traffic. A plugin module (the target
of an entry point in group ``procgroup``) implements one or both hooks::

    from procgroup.backend import BackendSpec, hookimpl

    @hookimpl
    def procgroup_backends():
        return [BackendSpec(name="tcp", loader=_load, devices=("cpu",))]

Heavy imports (mpi4py, pygloo, cupy) belong inside ``loader`` and ``unavailable`` so that
listing backends stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .backend._spec import PROJECT, BackendSpec, InitMethodSpec, hookimpl, hookspec


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


__all__ = ["BackendSpec", "InitMethodSpec", "PROJECT", "ProcGroupHookSpecs", "hookimpl", "hookspec"]
