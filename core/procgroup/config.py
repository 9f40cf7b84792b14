"""pydantic models for the user-facing settings of init_process_group, and env parsing.

Validation errors become :class:`~procgroup.errors.InvalidArgumentError` whose message
names the value, what was expected (in procgroup's words, never pydantic's) and where it
came from (argument or variable). pydantic is imported on first use, not with
``import procgroup`` (it is about half of the import time otherwise).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any
from collections.abc import Mapping

from ._settings import plain_problem, timeout_seconds
from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from pydantic import BaseModel

#: Default for every blocking call; PROCGROUP_TIMEOUT (seconds) overrides it.
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_BACKEND = "tcp"

ENV_BACKEND = "PROCGROUP_BACKEND"
ENV_TIMEOUT = "PROCGROUP_TIMEOUT"


@functools.cache
def _model() -> type[BaseModel]:
    """The InitSettings model, built (and pydantic imported) on first use."""
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    class InitSettings(BaseModel):
        """The arguments of init_process_group, after defaults from the environment."""

        model_config = ConfigDict(frozen=True, extra="forbid")

        backend: str = Field(min_length=1)
        init_method: str | None = None
        world_size: int = Field(ge=-1)
        rank: int = Field(ge=-1)
        group_name: str = ""
        timeout: float = Field(gt=0)

        @field_validator("world_size")
        @classmethod
        def _nonzero(cls, v: int) -> int:
            if v == 0:
                raise ValueError("must be positive, or -1 to take it from the init method")
            return v

    InitSettings.__module__ = __name__
    return InitSettings


def __getattr__(name: str) -> Any:
    if name == "InitSettings":
        return _model()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    class InitSettings(BaseModel):  # what _model() returns, for type checkers
        backend: str
        init_method: str | None
        world_size: int
        rank: int
        group_name: str
        timeout: float


def _describe(errors: list[dict[str, Any]], sources: Mapping[str, str]) -> str:
    parts = []
    for err in errors:
        field = str(err["loc"][0]) if err["loc"] else "?"
        where = sources.get(field, f"argument {field}")
        parts.append(f"{where}={err.get('input')!r}: {plain_problem(err)}")
    return "; ".join(parts)


def init_settings(
    backend: str | None,
    init_method: str | None,
    world_size: Any,
    rank: Any,
    group_name: Any,
    timeout: Any,
    environ: Mapping[str, str] | None = None,
) -> InitSettings:
    """Validate init_process_group's arguments; None values fall back to the environment."""
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
    from pydantic import ValidationError

    try:
        return _model()(  # type: ignore[return-value]
            backend=backend.lower() if isinstance(backend, str) else backend,
            init_method=init_method,
            world_size=world_size,
            rank=rank,
            group_name=group_name,
            timeout=timeout,
        )
    except ValidationError as exc:
        raise InvalidArgumentError(
            "init_process_group: " + _describe(exc.errors(), sources)  # type: ignore[arg-type]
        ) from None


__all__ = [
    "DEFAULT_BACKEND",
    "DEFAULT_TIMEOUT_S",
    "ENV_BACKEND",
    "ENV_TIMEOUT",
    "InitSettings",
    "init_settings",
]
