"""Variants: the things one sweep compares side by side.

A variant is one way of running the ops: a procgroup backend (``tcp``, ``mpi``, ...), or
a comparison outside procgroup (``torch-gloo``, ``raw-mpi4py``, ``raw-pygloo``, in their
own modules). All variants of a run are alive at once in every rank and share the same
host buffers, so their measurements interleave and every ratio comes from one run.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from typing import Any

import procgroup as pg

from ._sweep import Buffers

log = logging.getLogger(__name__)

#: One call of the op under test; returns once the op is complete on this rank.
Call = Callable[[], object]


class Variant(abc.ABC):
    """One implementation of the benchmarked ops, connected to every rank of the job."""

    label: str = "?"

    def unsupported(self, op: str) -> str | None:
        """Why ``op`` cannot run on this variant (None when it can); same answer on every rank."""
        return None

    @abc.abstractmethod
    def prepare(self, op: str, b: Buffers, rank: int, world_size: int) -> Call:
        """Bind ``op`` to the buffers ``b``, once per size, so the timed call does no setup."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Synchronize all ranks over this variant's own transport (before each timed call)."""

    def close(self) -> None:
        """Leave the variant's communicator (end of the run)."""


class ProcGroupVariant(Variant):
    """A procgroup backend, reached through the public API on a Group of every rank."""

    def __init__(self, label: str, group: Any) -> None:
        self.label = label
        self.group = group

    def prepare(self, op: str, b: Buffers, rank: int, world_size: int) -> Call:
        g = self.group
        if op == "all_reduce":
            return lambda: pg.all_reduce(b.recv, group=g)
        if op == "broadcast":
            return lambda: pg.broadcast(b.recv, 0, group=g)
        if op == "reduce":
            return lambda: pg.reduce(b.recv, 0, group=g)
        if op == "all_gather":
            return lambda: pg.all_gather(b.recv_chunks, b.send, group=g)
        if op == "reduce_scatter":
            return lambda: pg.reduce_scatter(b.recv, b.send_chunks, group=g)
        if op == "all_to_all":
            return lambda: pg.all_to_all(b.recv_chunks, b.send_chunks, group=g)
        if op == "pingpong":
            return pingpong_call(rank, lambda peer: pg.send(b.send, peer, group=g),
                                 lambda peer: pg.recv(b.recv, peer, group=g))
        raise ValueError(op)

    def barrier(self) -> None:
        pg.barrier(group=self.group)

    def close(self) -> None:
        if self.group is not None:  # None is the world, closed last by the run
            pg.destroy_process_group(self.group)


def pingpong_call(rank: int, send: Callable[[int], Any], recv: Callable[[int], Any]) -> Call:
    """Rank 0 sends to rank 1 and waits for the echo; rank 1 echoes; other ranks idle."""
    if rank == 0:
        def ping() -> None:
            send(1)
            recv(1)
        return ping
    if rank == 1:
        def pong() -> None:
            recv(0)
            send(0)
        return pong
    return lambda: None
