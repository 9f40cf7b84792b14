"""Settings of the gloo backend: ChannelContext.options first, then environment variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from procgroup.backend import env_choice
from procgroup.errors import InvalidArgumentError

#: Which library drives gloo: "auto" (default: pygloo when importable, else torch),
#: "pygloo" or "torch".
ENV_ENGINE = "PROCGROUP_GLOO_ENGINE"
#: all_reduce algorithm: "ring" (default) or "bcube" (pygloo engine only).
ENV_ALGORITHM = "PROCGROUP_GLOO_ALGORITHM"
#: "auto" (default), "always" or "never": check that every rank reached a collective
#: before entering gloo, so procgroup's timeout holds where gloo's fixed one would not.
ENV_ARRIVAL_CHECK = "PROCGROUP_GLOO_ARRIVAL_CHECK"

#: Below this channel timeout the arrival check is on by default. pygloo cannot change
#: gloo's context timeout (Context.setTimeout has no Python conversion for std::chrono),
#: so there any gloo call that waits longer than this fails; the torch engine gives gloo
#: procgroup's timeout, and uses the same rule so that a short timeout names the late ranks.
GLOO_TIMEOUT = 30.0

ENGINES = ("pygloo", "torch")
_ALGORITHMS = ("ring", "bcube")
#: The spellings of arrival_check: auto, always, never, then their aliases.
_ALWAYS = ("always", "1", "true", "yes")
_NEVER = ("never", "0", "false", "no")
_ARRIVAL = ("auto", "always", "never", *_ALWAYS[1:], *_NEVER[1:])


def _choice(options: Mapping[str, Any], name: str, env: str, choices: tuple[str, ...], default: str,
            what: str) -> str:
    try:
        return env_choice(env, choices, default, name=name, options=options)
    except InvalidArgumentError as exc:  # say which backend and which knob
        raise InvalidArgumentError(f"gloo {what}: {exc}") from None


def engine(options: Mapping[str, Any]) -> str:
    """The engine asked for by option ``engine`` or $PROCGROUP_GLOO_ENGINE: auto, pygloo or torch."""
    return _choice(options, "engine", ENV_ENGINE, ("auto", *ENGINES), "auto", "engine")


def allreduce_algorithm(options: Mapping[str, Any]) -> str:
    """"ring" or "bcube", chosen by option ``algorithm`` or $PROCGROUP_GLOO_ALGORITHM."""
    return _choice(options, "algorithm", ENV_ALGORITHM, _ALGORITHMS, "ring", "all_reduce algorithm")


def arrival_check(options: Mapping[str, Any], timeout: float) -> bool:
    """Whether collectives first confirm every rank arrived (costs one message round)."""
    value = _choice(options, "arrival_check", ENV_ARRIVAL_CHECK, _ARRIVAL, "auto",
                    "arrival check")
    if value == "auto":
        return timeout < GLOO_TIMEOUT
    return value in _ALWAYS


__all__ = ["ENGINES", "ENV_ALGORITHM", "ENV_ARRIVAL_CHECK", "ENV_ENGINE", "GLOO_TIMEOUT",
           "allreduce_algorithm", "arrival_check", "engine"]
