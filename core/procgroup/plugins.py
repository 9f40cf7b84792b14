"""Plugin discovery and the registry of backends by name.

Entry points in group ``procgroup`` are loaded on first use (never at import time) into
one cached pluggy PluginManager. We iterate the entry points ourselves rather than call
``PluginManager.load_setuptools_entrypoints`` because that stops at the first plugin
that fails to import; here a broken plugin is logged and skipped, and the rest load.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import logging
import threading
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Mapping, Sequence

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


@dataclass(frozen=True)
class _Broken:
    """A plugin that could not be used, and why; asking for its backend says so."""

    distribution: str
    entry_point: str  # "name = module"
    error: str


#: entry-point name -> the distribution that provides it
_plugin_dists: dict[str, str] = {}
#: backend (or entry-point) name -> why it cannot be used; costs only that name
_broken: dict[str, _Broken] = {}


@functools.cache
def get_plugin_manager() -> pluggy.PluginManager:
    """The one PluginManager, with every installed plugin that imports cleanly.

    A plugin that fails to import, or two that claim one name, cost only that name: the
    rest load, and asking for the name explains what is wrong (see get_backend_spec).
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(ProcGroupHookSpecs)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "?"
        plugin_name = ep.name if pm.get_plugin(ep.name) is None else f"{ep.name}@{dist}"
        try:
            module = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break the rest
            log.warning("procgroup plugin %r (distribution %s, entry point '%s = %s') failed to import "
                        "and is skipped: %s: %s", ep.name, dist, ep.name, ep.value, type(exc).__name__, exc)
            _broken.setdefault(ep.name.lower(), _Broken(dist, f"{ep.name} = {ep.value}",
                                                        f"{type(exc).__name__}: {exc}"))
            continue
        pm.register(module, name=plugin_name)
        _plugin_dists[plugin_name] = dist
    return pm


def _dist_of(plugin_name: str) -> str:
    return _plugin_dists.get(plugin_name, plugin_name)


@functools.cache
def _plugin_backends() -> dict[str, BackendSpec]:
    pm = get_plugin_manager()
    found: dict[str, BackendSpec] = {}
    claims: dict[str, list[str]] = {}
    for plugin in pm.get_plugins():
        plugin_name = pm.get_name(plugin) or "?"
        dist = _dist_of(plugin_name)
        hook = getattr(plugin, "procgroup_backends", None)
        if hook is None:
            continue
        try:
            specs = list(hook())
        except Exception as exc:  # noqa: BLE001 - costs only this plugin
            log.warning("procgroup plugin %s: procgroup_backends() failed and is skipped: %s", dist, exc)
            _broken.setdefault(plugin_name.lower(), _Broken(dist, plugin_name, f"procgroup_backends() failed: {exc}"))
            continue
        for spec in specs:
            if not isinstance(spec, BackendSpec) or not isinstance(spec.name, str) or spec.name != spec.name.lower():
                log.warning("procgroup plugin %s: procgroup_backends() returned %r; backends are BackendSpec "
                            "records with lower-case names: skipped", dist, spec)
                continue
            claims.setdefault(spec.name, []).append(dist)
            found.setdefault(spec.name, _with_dist(spec, dist))
    for name, dists in claims.items():
        if len(dists) > 1:
            del found[name]
            log.warning("procgroup: backend name %r is claimed by %s; it is unusable until one is uninstalled",
                        name, " and ".join(dists))
            _broken[name] = _Broken(" and ".join(dists), name, "two plugins claim this backend name")
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
        loader: Callable[[], type] = lambda: cls  # noqa: E731 - a loader that closes over cls
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
    """The spec for ``name``, or an error that says why not: a broken or doubly claimed
    plugin (naming distributions, entry point and error), or the choices, a "did you
    mean" and the install hint."""
    if not isinstance(name, str):
        raise BackendNotFoundError(f"backend must be a name (str), got {name!r}")
    key = name.lower()
    found = backends()
    if key in found:
        return found[key]
    broken = _broken.get(key)
    if broken is not None:
        if broken.error == "two plugins claim this backend name":
            raise PluginError(f"two plugins claim the backend name {key!r}: {broken.distribution}; uninstall one")
        raise BackendUnavailableError(
            f"backend {key!r} is installed (distribution {broken.distribution}, entry point "
            f"'{broken.entry_point}') but its plugin failed to import: {broken.error}")
    installed = ", ".join(found) or "(none installed)"
    if key in KNOWN_BACKENDS:
        raise BackendNotFoundError(
            f"backend {name!r} is not installed; install it with `{KNOWN_BACKENDS[key]}` (installed: {installed})")
    close = difflib.get_close_matches(key, [*found, *KNOWN_BACKENDS], n=1, cutoff=0.6)
    hint = [f"did you mean {close[0]!r}?"] if close else []
    raise BackendNotFoundError("; ".join([f"unknown backend {name!r}", *hint, f"choose one of: {installed}"]))


def load_channel_class(name: str) -> tuple[BackendSpec, type[DataChannel]]:
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
    _broken.clear()


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
