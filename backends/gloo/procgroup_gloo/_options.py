"""Settings of the gloo backend: ChannelContext.options first, then environment variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from procgroup.backend import env_choice
from procgroup.errors import InvalidArgumentError

#: all_reduce algorithm: "ring" (default) or "bcube".
ENV_ALGORITHM = "PROCGROUP_GLOO_ALGORITHM"
#: "auto" (default), "always" or "never": check that every rank reached a collective
#: before entering gloo, so procgroup's timeout holds where gloo's fixed one would not.
ENV_ARRIVAL_CHECK = "PROCGROUP_GLOO_ARRIVAL_CHECK"

#: gloo's context timeout. pygloo cannot change it (Context.setTimeout has no Python
#: conversion for std::chrono), so any gloo call that waits longer than this fails.
GLOO_TIMEOUT = 30.0

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


def allreduce_algorithm(options: Mapping[str, Any]) -> Any:
    """pygloo's allreduceAlgorithm chosen by option ``algorithm`` or $PROCGROUP_GLOO_ALGORITHM."""
    import pygloo

    value = _choice(options, "algorithm", ENV_ALGORITHM, _ALGORITHMS, "ring", "all_reduce algorithm")
    return pygloo.allreduceAlgorithm.RING if value == "ring" else pygloo.allreduceAlgorithm.BCUBE


def arrival_check(options: Mapping[str, Any], timeout: float) -> bool:
    """Whether collectives first confirm every rank arrived (costs one message round)."""
    value = _choice(options, "arrival_check", ENV_ARRIVAL_CHECK, _ARRIVAL, "auto",
                    "arrival check")
    if value == "auto":
        return timeout < GLOO_TIMEOUT
    return value in _ALWAYS


__all__ = ["ENV_ALGORITHM", "ENV_ARRIVAL_CHECK", "GLOO_TIMEOUT", "allreduce_algorithm", "arrival_check"]
