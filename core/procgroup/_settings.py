"""One parser for settings: flags, choices and timeouts (init, rendezvous, backends).

A setting comes from the channel's options first (``ChannelContext.options``), then an
environment variable, then a default; a bad value is an InvalidArgumentError naming
where it came from, so a user knows which knob to fix.
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Any
from collections.abc import Mapping

from .errors import InvalidArgumentError

#: Larger timeouts overflow the OS's waits (sockets, condition variables, epoll).
MAX_TIMEOUT_S = 1e9

#: What a ``timeout=`` argument takes: seconds, a ``datetime.timedelta``, or None for the default.
Timeout = float | datetime.timedelta | None

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def setting(name: str, env: str | None = None, default: str = "",
            options: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """(value lower-cased and stripped, where it came from) for one setting."""
    if options is not None and options.get(name) is not None:
        return str(options[name]).strip().lower(), f"option {name!r}"
    if env and os.environ.get(env, "").strip():
        return os.environ[env].strip().lower(), f"environment variable {env}"
    return default, "default"


def env_flag(env: str, default: bool, *, name: str = "", options: Mapping[str, Any] | None = None) -> bool:
    """A boolean setting: 1/true/yes/on or 0/false/no/off (anything else is an error)."""
    value, source = setting(name or env, env, "1" if default else "0", options)
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidArgumentError(f"{source}={value!r}: expected one of 1, 0, true, false, yes, no, on, off")


def env_choice(env: str, choices: tuple[str, ...], default: str, *, name: str = "",
               options: Mapping[str, Any] | None = None) -> str:
    """A setting that must be one of ``choices``."""
    value, source = setting(name or env, env, default, options)
    if value not in choices:
        raise InvalidArgumentError(f"{source}={value!r}: choose one of {', '.join(choices)}")
    return value


def env_bytes(env: str, default: int | None, *, minimum: int = 0, name: str = "",
              options: Mapping[str, Any] | None = None, hint: str = "") -> int | None:
    """A byte count (a whole number >= ``minimum``), else ``default``; ``hint`` says what a
    special value means in the error (e.g. "0: the kernel's autotuning")."""
    return env_count(env, default, minimum=minimum, name=name, options=options, hint=hint)


def env_count(env: str, default: int | None, *, minimum: int = 0, name: str = "",
              options: Mapping[str, Any] | None = None, hint: str = "", unit: str = "bytes") -> int | None:
    """A count of ``unit`` (a whole number >= ``minimum``), else ``default``."""
    value, source = setting(name or env, env, "", options)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        extra = f" ({hint})" if hint else ""
        raise InvalidArgumentError(f"{source}={value!r}: expected a number of {unit} >= {minimum}{extra}")
    return number


def timeout_seconds(value: Any, *, source: str = "argument timeout") -> float:
    """A ``datetime.timedelta`` or a number of seconds, positive and at most MAX_TIMEOUT_S."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
    else:
        seconds = math.nan
    if math.isnan(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(
            f"{source}={value!r}: must be a positive number of seconds or a datetime.timedelta, "
            f"at most {MAX_TIMEOUT_S:.0f} s (about 30 years)"
        )
    return seconds


def env_timeout(env: str, default: float) -> float:
    """A timeout in seconds from ``env``, else ``default``."""
    raw = os.environ.get(env, "").strip()
    return timeout_seconds(raw, source=f"environment variable {env}") if raw else default


__all__ = ["MAX_TIMEOUT_S", "Timeout", "env_bytes", "env_choice", "env_flag", "env_timeout", "setting",
           "timeout_seconds"]
