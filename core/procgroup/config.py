"""The settings of init_process_group: one model, validated once.

:func:`init_settings` turns init_process_group's arguments (with defaults from the
environment) into a frozen :class:`InitSettings`, or raises one
:class:`~procgroup.errors.InvalidArgumentError` that names every bad value, what was
expected (in procgroup's words) and where it came from (argument or variable). Nothing
after it re-checks these values: the lifecycle and the rendezvous take them as given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._settings import timeout_seconds
from .errors import InvalidArgumentError

#: Default for every blocking call; PROCGROUP_TIMEOUT (seconds) overrides it.
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_BACKEND = "tcp"

ENV_BACKEND = "PROCGROUP_BACKEND"
ENV_TIMEOUT = "PROCGROUP_TIMEOUT"


@dataclass(frozen=True)
class InitSettings:
    """The arguments of init_process_group, validated, after defaults from the environment.

    ``world_size`` and ``rank`` are -1 when not given (the init method or the backend's
    launcher says); ``world_size`` is 0 only for torch's MPI recipe ("the launcher
    decides"), which init_process_group accepts only for a backend with its own launcher.
    """

    backend: str
    init_method: str | None
    world_size: int
    rank: int
    group_name: str
    timeout: float
    options: Mapping[str, Any] = field(default_factory=dict)
    token: str | bytes | None = None
    store: Any = None

    def refuse_size_zero(self, *, unless: bool) -> None:
        """world_size=0 ("the launcher decides") is an error ``unless`` the backend's own
        launcher gives rank and size."""
        if self.world_size == 0 and not unless:
            raise InvalidArgumentError(f"init_process_group: argument world_size=0: {_SIZE_ZERO}")


_SIZE_ZERO = "must be positive, or -1 to take it from the init method"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value: Any) -> Any:
    """A whole number given as text ("4", from an environment variable) as an int; any
    other value as it is (then checked)."""
    if isinstance(value, str) and value.strip().removeprefix("-").isdigit():
        return int(value)
    return value


def _problems(s: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) for every bad value of ``s``, in argument order."""
    out: list[tuple[str, str]] = []
    if not isinstance(s["backend"], str):
        out.append(("backend", "must be a str"))
    elif not s["backend"]:
        out.append(("backend", "must not be empty"))
    if s["init_method"] is not None and not isinstance(s["init_method"], str):
        out.append(("init_method", "must be a str"))
    for name in ("world_size", "rank"):
        if not _whole(s[name]):
            out.append((name, "must be a whole number"))
        elif s[name] < -1:
            out.append((name, "must be >= -1"))
    if not isinstance(s["group_name"], str):
        out.append(("group_name", "must be a str"))
    if not isinstance(s["options"], Mapping):
        out.append(("options", f"must be a dict, got {type(s['options']).__name__}"))
    if s["token"] is not None and not isinstance(s["token"], (str, bytes)):
        out.append(("token", f"must be a str or bytes, got {type(s['token']).__name__}"))
    return out


def _check_store(s: InitSettings) -> None:
    """store=... replaces the init method: rank and world_size must then be given."""
    if s.store is None:
        return
    if s.init_method is not None:
        raise InvalidArgumentError("init_process_group: pass either init_method or store, not both")
    if s.rank < 0 or s.world_size < 1:
        raise InvalidArgumentError("init_process_group: with store=..., rank and world_size must be given")
    if s.rank >= s.world_size:
        raise InvalidArgumentError(f"init_process_group: rank {s.rank} is outside the world of size {s.world_size}")


def init_settings(
    backend: Any,
    init_method: Any,
    world_size: Any,
    rank: Any,
    group_name: Any,
    timeout: Any,
    environ: Mapping[str, str] | None = None,
    *,
    options: Any = None,
    token: Any = None,
    store: Any = None,
) -> InitSettings:
    """Validate init_process_group's arguments; None values fall back to the environment.

    ``world_size=0`` passes here; :meth:`InitSettings.refuse_size_zero` decides once the
    backend is known.
    """
    env = os.environ if environ is None else environ
    sources: dict[str, str] = {}
    if backend is None:
        backend = env.get(ENV_BACKEND) or DEFAULT_BACKEND
        sources["backend"] = f"environment variable {ENV_BACKEND}" if env.get(ENV_BACKEND) else "default backend"
    if timeout is None:
        if env.get(ENV_TIMEOUT):
            timeout = timeout_seconds(env[ENV_TIMEOUT], source=f"environment variable {ENV_TIMEOUT}")
        else:
            timeout = DEFAULT_TIMEOUT_S
    else:
        timeout = timeout_seconds(timeout)
    values: dict[str, Any] = {
        "backend": backend.lower() if isinstance(backend, str) else backend, "init_method": init_method,
        "world_size": _as_int(world_size), "rank": _as_int(rank), "group_name": group_name, "timeout": timeout,
        "options": {} if options is None else options, "token": token, "store": store,
    }
    problems = _problems(values)
    if problems:
        raise InvalidArgumentError("init_process_group: " + "; ".join(
            f"{sources.get(name, f'argument {name}')}={values[name]!r}: {problem}" for name, problem in problems))
    settings = InitSettings(**values)
    _check_store(settings)
    return settings


__all__ = [
    "DEFAULT_BACKEND",
    "DEFAULT_TIMEOUT_S",
    "ENV_BACKEND",
    "ENV_TIMEOUT",
    "InitSettings",
    "init_settings",
]
