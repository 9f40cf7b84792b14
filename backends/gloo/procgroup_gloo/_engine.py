"""The gloo engines: which library drives gloo, and the calls a GlooChannel makes on one.

Two libraries can drive gloo from Python. pygloo (wheels for CPython 3.8-3.10 only)
takes raw pointers and holds the GIL for the whole of every call. torch ships gloo
inside torch.distributed (ProcessGroupGloo, on every Python torch has wheels for) and
releases the GIL while gloo works. :class:`Engine` is what GlooChannel needs from
either: one gloo context of the channel's members and the collectives on the caller's
NumPy memory. Everything else (validation, lowering tables, point-to-point, barrier,
timeouts, errors) stays in the channel, so both engines behave alike.

This module never imports pygloo or torch: listing backends must stay cheap.
"""

from __future__ import annotations

import abc
import importlib.util
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any, ClassVar

import numpy as np
from procgroup.backend import ChannelContext, DataChannel, Lowered, ReduceTable

from . import _options

PYGLOO_WHEELS = "pygloo publishes wheels only for CPython 3.8-3.10 on x86-64 Linux"
TORCH_HINT = "pip install procgroup-gloo[torch]"


class Engine(abc.ABC):
    """One gloo context over a channel's members. Arrays are 1-d, C-contiguous NumPy
    arrays of the caller's memory (or the channel's scratch); results land in them.

    A failed gloo call raises RuntimeError (the channel turns it into PeerError or
    CommTimeoutError); a ProcGroupError raised by ``interrupt`` passes through.
    """

    name: ClassVar[str]
    #: How (dtype, ReduceOp) lowers onto this engine (procgroup_gloo._dtypes).
    table: ClassVar[ReduceTable]

    @classmethod
    @abc.abstractmethod
    def connect(cls, ctx: ChannelContext, p2p: DataChannel, device: Any, algorithm: str,
                interrupt: Callable[[], None], tag: int) -> Engine:
        """Build the context of ``ctx.size`` ranks. ``device``: the world's gloo device to
        share (None: make one); ``interrupt``: raises when a wait must end early (channel
        closed, a member lost); ``tag``: a side-channel tag this rendezvous may use."""

    #: The gloo device, shared with the channels of groups.
    device: Any

    @abc.abstractmethod
    def broadcast(self, buf: np.ndarray, src: int) -> None:
        """``buf`` (bytes) from ``src`` to every rank, in place."""

    @abc.abstractmethod
    def all_reduce(self, a: np.ndarray, plan: Lowered) -> None:
        """Reduce ``a`` (already viewed as ``plan`` says) in place on every rank."""

    @abc.abstractmethod
    def reduce(self, a: np.ndarray, scratch: np.ndarray | None, plan: Lowered, dst: int) -> None:
        """Reduce into ``a`` at ``dst``; other ranks pass ``scratch`` (shaped like ``a``)
        so that their ``a`` stays unchanged."""

    @abc.abstractmethod
    def all_gather(self, src: np.ndarray, dest: np.ndarray) -> None:
        """Every rank's ``src`` bytes, in rank order, into ``dest`` (size x src.nbytes)."""

    @abc.abstractmethod
    def gather(self, src: np.ndarray, dest: np.ndarray | None, dst: int) -> None:
        """As all_gather, into ``dest`` at ``dst`` only (None elsewhere)."""

    @abc.abstractmethod
    def scatter(self, inputs: Sequence[np.ndarray] | None, out: np.ndarray, src: int) -> None:
        """``inputs[r]`` (bytes, at ``src``) into rank r's ``out``."""

    @abc.abstractmethod
    def reduce_scatter(self, whole: np.ndarray, out: np.ndarray, plan: Lowered) -> None:
        """Reduce ``whole`` (size x out.size elements) and leave piece r in rank r's ``out``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the gloo connections; never raises."""


# ---------------------------------------------------------------------- which engine
def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _here() -> str:
    return (f"{platform.python_implementation()} {sys.version_info.major}.{sys.version_info.minor} "
            f"on {sys.platform}/{platform.machine()}")


def why_not(engine: str) -> str | None:
    """None when ``engine`` can run here, else why not (with the install command)."""
    if engine == "pygloo":
        if _importable("pygloo"):
            return None
        return f"pygloo is not installed ({PYGLOO_WHEELS}; this is {_here()}); pip install pygloo"
    if _importable("torch"):
        return None
    return f"torch is not installed (its ProcessGroupGloo drives gloo on any Python); {TORCH_HINT}"


def resolve(options: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the engine that runs, why) for the given options and environment; (None, why
    nothing can run) when the engine asked for, or every engine, is missing."""
    asked = _options.engine(options)
    if asked != "auto":
        reason = why_not(asked)
        source = "option engine" if "engine" in options else f"${_options.ENV_ENGINE}"
        if reason is None:
            return asked, f"{source}={asked}"
        return None, f"{source}={asked}, but {reason}"
    pygloo, torch = why_not("pygloo"), why_not("torch")
    if pygloo is None:
        return "pygloo", "auto: pygloo is importable"
    if torch is None:
        return "torch", "auto: pygloo is not importable"
    return None, f"{pygloo}; or {torch}"


def unavailable_reason() -> str | None:
    """For BackendSpec.unavailable: None when an engine can run with the environment's setting."""
    try:
        name, why = resolve({})
    except Exception as exc:  # noqa: BLE001 - a bad $PROCGROUP_GLOO_ENGINE is the reason
        return str(exc)
    return None if name is not None else why


def describe() -> str | None:
    """One line for ``python -m procgroup info``: the engine that runs and why; the other's state."""
    try:
        name, why = resolve({})
    except Exception as exc:  # noqa: BLE001 - shown, not raised, when listing
        return str(exc)
    if name is None:
        return None
    other = "torch" if name == "pygloo" else "pygloo"
    reason = why_not(other)
    state = f"{other} {_version(other)} also importable (set {_options.ENV_ENGINE}={other} to use it)" \
        if reason is None else f"{other} unavailable: {reason}"
    return f"engine {name} {_version(name)} ({why}); {state}"


def _version(module: str) -> str:
    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


__all__ = ["PYGLOO_WHEELS", "TORCH_HINT", "Engine", "describe", "resolve", "unavailable_reason", "why_not"]
