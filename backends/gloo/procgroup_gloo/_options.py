"""Settings of the gloo backend: ChannelContext.options first, then environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from procgroup.errors import InvalidArgumentError

#: all_reduce algorithm: "ring" (default) or "bcube".
ENV_ALGORITHM = "PROCGROUP_GLOO_ALGORITHM"
#: "auto" (default), "always" or "never": check that every rank reached a collective
#: before entering gloo, so procgroup's timeout holds where gloo's fixed one would not.
ENV_ARRIVAL_CHECK = "PROCGROUP_GLOO_ARRIVAL_CHECK"

#: gloo's context timeout. pygloo cannot change it (Context.setTimeout has no Python
#: conversion for std::chrono), so any gloo call that waits longer than this fails.
GLOO_TIMEOUT = 30.0


def _setting(options: Mapping[str, Any], key: str, env: str, default: str) -> tuple[str, str]:
    if key in options and options[key] is not None:
        return str(options[key]).strip().lower(), f"option {key!r}"
    if os.environ.get(env):
        return os.environ[env].strip().lower(), f"environment variable {env}"
    return default, "default"


def allreduce_algorithm(options: Mapping[str, Any]) -> Any:
    """pygloo's allreduceAlgorithm chosen by option ``algorithm`` or $PROCGROUP_GLOO_ALGORITHM."""
    import pygloo

    value, source = _setting(options, "algorithm", ENV_ALGORITHM, "ring")
    table = {"ring": pygloo.allreduceAlgorithm.RING, "bcube": pygloo.allreduceAlgorithm.BCUBE}
    if value not in table:
        raise InvalidArgumentError(f"gloo: {source}={value!r} is not an all_reduce algorithm; choose ring or bcube")
    return table[value]


def arrival_check(options: Mapping[str, Any], timeout: float) -> bool:
    """Whether collectives first confirm every rank arrived (costs one message round)."""
    value, source = _setting(options, "arrival_check", ENV_ARRIVAL_CHECK, "auto")
    if value == "auto":
        return timeout < GLOO_TIMEOUT
    if value in ("always", "1", "true", "yes"):
        return True
    if value in ("never", "0", "false", "no"):
        return False
    raise InvalidArgumentError(f"gloo: {source}={value!r}; choose auto, always or never")


__all__ = ["ENV_ALGORITHM", "ENV_ARRIVAL_CHECK", "GLOO_TIMEOUT", "allreduce_algorithm", "arrival_check"]
