"""The pygloo engine: gloo calls on raw pointers to the caller's memory.

pygloo holds the GIL for the whole of every gloo call, so nothing else of the process
runs meanwhile; the channel's arrival check and barrier (on the side channel) keep
procgroup's timeout where gloo's fixed 30 s would not. The context's keys are exchanged
over the side channel (see _rendezvous.py for why not the Store).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from procgroup.backend import ChannelContext, DataChannel, Lowered, host_address
from procgroup.errors import InvalidArgumentError

from ._dtypes import PYGLOO
from ._engine import Engine
from ._memory import address
from ._rendezvous import connect_context, create_device

log = logging.getLogger(__name__)


class PyglooEngine(Engine):
    """A pygloo context; every call blocks in C++ (GIL held) until gloo returns."""

    name: ClassVar[str] = "pygloo"
    table = PYGLOO

    def __init__(self, context: Any, device: Any, algorithm: str, size: int) -> None:
        import pygloo

        self._pg = pygloo
        self._context = context
        self.device = device
        self._u8 = pygloo.glooDataType_t.glooUint8
        self.algorithm = pygloo.allreduceAlgorithm.BCUBE if algorithm == "bcube" else pygloo.allreduceAlgorithm.RING
        self._size = size
        self._tag = 0

    @classmethod
    def connect(cls, ctx: ChannelContext, p2p: DataChannel, device: Any, algorithm: str,
                interrupt: Callable[[], None], tag: int) -> PyglooEngine:
        if algorithm not in ("ring", "bcube"):
            raise InvalidArgumentError(f"gloo all_reduce algorithm {algorithm!r}: choose one of ring, bcube")
        if device is None:
            device = create_device(host_address(ctx))
        return cls(connect_context(ctx, p2p, device, tag), device, algorithm, ctx.size)

    @property
    def context(self) -> Any:
        """The pygloo context (bench/gloo_overhead.py runs raw pygloo calls on it)."""
        return self._context

    def _next_tag(self) -> int:
        self._tag = (self._tag + 1) & 0xFFFFFFFF  # gloo tags are uint32
        return self._tag

    def broadcast(self, buf: np.ndarray, src: int) -> None:
        p = address(buf)
        self._pg.broadcast(self._context, p, p, buf.size, self._u8, src, self._next_tag())

    def all_reduce(self, a: np.ndarray, plan: Lowered) -> None:
        p = address(a)
        self._pg.allreduce(self._context, p, p, a.size, plan.dtype, plan.op, self.algorithm, self._next_tag())

    def reduce(self, a: np.ndarray, scratch: np.ndarray | None, plan: Lowered, dst: int) -> None:
        # gloo accumulates into the output on every rank: non-roots write their scratch
        out = a if scratch is None else scratch
        self._pg.reduce(self._context, address(a), address(out), a.size, plan.dtype, plan.op, dst,
                        self._next_tag())

    def all_gather(self, src: np.ndarray, dest: np.ndarray) -> None:
        self._pg.allgather(self._context, address(src), address(dest), src.size, self._u8, self._next_tag())

    def gather(self, src: np.ndarray, dest: np.ndarray | None, dst: int) -> None:
        out = src if dest is None else dest  # ignored by gloo off the root
        self._pg.gather(self._context, address(src), address(out), src.size, self._u8, dst, self._next_tag())

    def scatter(self, inputs: Sequence[np.ndarray] | None, out: np.ndarray, src: int) -> None:
        pointers = [address(a) for a in inputs] if inputs is not None else [address(out)] * self._size
        self._pg.scatter(self._context, pointers, address(out), out.size, self._u8, src, self._next_tag())

    def reduce_scatter(self, whole: np.ndarray, out: np.ndarray, plan: Lowered) -> None:
        n = out.size
        size = whole.size // n
        self._pg.reduce_scatter(self._context, address(whole), address(out), whole.size, [n] * size,
                                plan.dtype, plan.op)

    def close(self) -> None:
        context, self._context = self._context, None
        if context is not None:
            try:
                context.closeConnections()  # peers blocked on this rank fail at once
            except RuntimeError:
                log.debug("gloo closeConnections failed", exc_info=True)


__all__ = ["PyglooEngine"]
