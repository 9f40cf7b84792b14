"""Plugin discovery and the registry of backends by name.

Entry points in group ``procgroup`` are loaded on first use (never at import time) into
one cached pluggy PluginManager. We iterate the entry points ourselves rather than call
``PluginManager.load_setuptools_entrypoints`` because that stops at the first plugin
that fails to import; here a broken plugin is logged and skipped, and the rest load.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import threading
from typing import Any, Callable, Mapping, Sequence

import pluggy

from .errors import BackendNotFoundError, BackendUnavailableError, PluginError
from .backend import BackendSpec, DataChannel, InitMethodSpec
from .hookspecs import PROJECT, ProcGroupHookSpecs
from .rendezvous import _methods as _rendezvous_methods

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "procgroup"

#: Backends this project ships, for the "pip install ..." hint when one is missing.
KNOWN_BACKENDS: Mapping[str, str] = {
    "tcp": "pip install procgroup-tcp",
    "mpi": "pip install 'procgroup-mpi[mpich]'",
    "gloo": "pip install procgroup-gloo",
    "nccl": "pip install procgroup-nccl",
}

_runtime_lock = threading.Lock()
_runtime_backends: dict[str, BackendSpec] = {}


@functools.cache
def get_plugin_manager() -> pluggy.PluginManager:
    """The one PluginManager, with every installed plugin that imports cleanly."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(ProcGroupHookSpecs)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        if pm.get_plugin(ep.name) is not None:
            raise PluginError(
                f"two plugins claim the backend name {ep.name!r}: "
                f"{_dist_of(ep.name)} and {dist}; uninstall one"
            )
        try:
            module = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
            log.warning("procgroup plugin %r (%s) failed to import and is skipped: %s", ep.name, dist, exc)
            continue
        pm.register(module, name=ep.name)
        _plugin_dists[ep.name] = dist
    return pm


_plugin_dists: dict[str, str] = {}


def _dist_of(plugin_name: str) -> str:
    return _plugin_dists.get(plugin_name, plugin_name)


@functools.cache
def _plugin_backends() -> dict[str, BackendSpec]:
    pm = get_plugin_manager()
    found: dict[str, BackendSpec] = {}
    for plugin in pm.get_plugins():
        plugin_name = pm.get_name(plugin) or "?"
        dist = _dist_of(plugin_name)
        hook = getattr(plugin, "procgroup_backends", None)
        if hook is None:
            continue
        try:
            specs = list(hook())
        except Exception as exc:  # noqa: BLE001
            log.warning("procgroup plugin %s: procgroup_backends() failed and is skipped: %s", dist, exc)
            continue
        for spec in specs:
            if not isinstance(spec, BackendSpec):
                raise PluginError(f"plugin {dist}: procgroup_backends() must return BackendSpec records, got {spec!r}")
            if spec.name in found:
                raise PluginError(
                    f"two plugins claim the backend name {spec.name!r}: "
                    f"{found[spec.name].distribution} and {dist}; uninstall one"
                )
            found[spec.name] = _with_dist(spec, dist)
            if spec.name != spec.name.lower():
                raise PluginError(f"plugin {dist}: backend names are lower case, got {spec.name!r}")
    return found


def _with_dist(spec: BackendSpec, dist: str) -> BackendSpec:
    from dataclasses import replace

    return replace(spec, distribution=dist)


def register_backend(
    name: str,
    channel: Callable[[], type] | type,
    *,
    devices: Sequence[str] = ("cpu",),
    unavailable: Callable[[], str | None] | None = None,
    description: str = "",
    side_channel: int = 0,
) -> BackendSpec:
    """Register a DataChannel at run time, without packaging it as a plugin.

    ``channel`` is the DataChannel subclass or a zero-argument loader returning it;
    ``unavailable`` returns None or why the backend cannot run here.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise PluginError(f"backend name must be an identifier-like string, got {name!r}")
    name = name.lower()  # names are matched case-insensitively
    if isinstance(channel, type):
        if not issubclass(channel, DataChannel):
            raise PluginError(f"register_backend({name!r}): {channel.__name__} is not a procgroup.DataChannel subclass")
        cls = channel
        loader: Callable[[], type] = lambda: cls  # noqa: E731
    elif callable(channel):
        loader = channel
    else:
        raise PluginError(f"register_backend({name!r}): expected a DataChannel subclass or a loader, got {channel!r}")
    kwargs: dict[str, Any] = {"devices": tuple(devices), "description": description,
                              "side_channel": side_channel}
    if unavailable is not None:
        kwargs["unavailable"] = unavailable
    spec = BackendSpec(name=name, loader=loader, distribution="(registered at run time)", **kwargs)
    with _runtime_lock:
        if name in _plugin_backends():
            raise PluginError(
                f"backend name {name!r} is already provided by {_plugin_backends()[name].distribution}"
            )
        _runtime_backends[name] = spec
    return spec


def unregister_backend(name: str) -> None:
    """Drop a backend registered with :func:`register_backend` (tests, notebooks)."""
    with _runtime_lock:
        _runtime_backends.pop(name, None)


def backends() -> dict[str, BackendSpec]:
    """Every installed or registered backend, by name (sorted)."""
    merged = {**_plugin_backends(), **_runtime_backends}
    return dict(sorted(merged.items()))


def get_backend_spec(name: str) -> BackendSpec:
    """The spec for ``name``, or an error listing the choices and the install hint."""
    if not isinstance(name, str):
        raise BackendNotFoundError(f"backend must be a name (str), got {name!r}")
    key = name.lower()
    found = backends()
    if key in found:
        return found[key]
    installed = ", ".join(found) or "(none installed)"
    msg = f"unknown backend {name!r}; choose one of: {installed}"
    if key in KNOWN_BACKENDS:
        msg = f"backend {name!r} is not installed; install it with `{KNOWN_BACKENDS[key]}` (installed: {installed})"
    raise BackendNotFoundError(msg)


def load_channel_class(name: str) -> tuple[BackendSpec, type]:
    """Resolve ``name`` once at init: check availability and import the DataChannel class."""
    spec = get_backend_spec(name)
    reason = spec.unavailable()
    if reason:
        raise BackendUnavailableError(f"backend {spec.name!r} is installed but cannot run here: {reason}")
    try:
        cls = spec.loader()
    except ImportError as exc:
        raise BackendUnavailableError(f"backend {spec.name!r} failed to load: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, DataChannel)):
        raise PluginError(f"backend {spec.name!r} ({spec.distribution}): loader returned {cls!r}, not a DataChannel subclass")
    if not cls.backend_name:
        cls.backend_name = spec.name
    return spec, cls


def side_channel_spec() -> BackendSpec | None:
    """The installed backend that serves host side channels best (highest
    ``side_channel``, among those that can run here), or None."""
    best: BackendSpec | None = None
    for spec in backends().values():
        if spec.side_channel > 0 and (best is None or spec.side_channel > best.side_channel):
            try:
                if spec.unavailable():
                    continue
            except Exception:  # noqa: BLE001 - a broken check costs only its backend
                continue
            best = spec
    return best


def api_function(name: str) -> Callable[..., Any] | None:
    """A public function a plugin adds to ``procgroup`` (BackendSpec.api), or None."""
    for spec in backends().values():
        if name in spec.api:
            return spec.api[name]
    return None


def extra_init_methods() -> dict[str, Callable[..., object]]:
    """Init-method URL schemes contributed by plugins: scheme -> handler."""
    result: dict[str, Callable[..., object]] = {}
    pm = get_plugin_manager()
    for contributed in pm.hook.procgroup_init_methods():
        items = contributed.items() if isinstance(contributed, Mapping) else (
            (s.scheme, s.handler) for s in contributed if isinstance(s, InitMethodSpec)
        )
        for scheme, handler in items:
            if scheme in result:
                raise PluginError(f"two plugins register the init-method scheme {scheme!r}")
            result[scheme] = handler
    return result


# rendezvous sits below the registry: give it the plugin schemes without importing us
_rendezvous_methods.set_plugin_source(extra_init_methods)


def reset_plugin_cache() -> None:
    """Forget discovered plugins (tests install/uninstall plugins and rediscover)."""
    get_plugin_manager.cache_clear()
    _plugin_backends.cache_clear()
    _plugin_dists.clear()


__all__ = [
    "ENTRY_POINT_GROUP",
    "KNOWN_BACKENDS",
    "api_function",
    "backends",
    "extra_init_methods",
    "get_backend_spec",
    "get_plugin_manager",
    "load_channel_class",
    "register_backend",
    "reset_plugin_cache",
    "side_channel_spec",
    "unregister_backend",
]
