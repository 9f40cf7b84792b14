"""The torch engine: torch.distributed's ProcessGroupGloo on the caller's NumPy memory.

Every array becomes a tensor over the same memory (``torch.from_numpy``: no copy), so
results land in the caller's array. torch releases the GIL while gloo works, so the
process's other threads (the side channel's readers, a Store served by this rank) keep
running, and gloo's own timeout can be procgroup's (pygloo cannot set it).

Rendezvous: ProcessGroupGloo asks a torch Store for its peers' addresses.
:class:`_StoreAdapter` (a ``torch.distributed.Store`` written in Python) forwards those
calls to the channel's own procgroup Store, which every init method provides and whose
server authenticates each client with the job token. No torch TCPStore is ever opened:
it would listen without authentication (docs/security.md).

Waiting: a torch Work cannot be cancelled (ProcessGroupGloo's abort() and shutdown() leave
a pending op running), so the engine waits in short slices and between them asks the
channel whether to give up (closed, or the side channel lost a member), so close() and a
peer's death end the wait at once. An op given up on keeps running in torch's threads
until gloo's timeout or the peers' sockets close; its ProcessGroupGloo is kept alive
meanwhile (dropping it would block in its destructor until that op ends).
"""

from __future__ import annotations

import datetime
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from procgroup.backend import ChannelContext, DataChannel, Lowered, host_address
from procgroup.errors import InvalidArgumentError, ProcGroupError, RendezvousError
from procgroup.rendezvous import PrefixStore, Store

from ._dtypes import TORCH
from ._engine import Engine

log = logging.getLogger(__name__)

#: How long one wait on a torch Work lasts before the channel is asked whether to go on.
_SLICE = datetime.timedelta(milliseconds=50)
#: ProcessGroupGloos with an op still pending when their channel closed (see module doc).
_RETIRED: list[Any] = []


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class _StoreAdapter(dist.Store):
    """A torch Store whose calls go to a procgroup Store (authenticated, any init method)."""

    def __init__(self, store: Store, timeout: float) -> None:
        super().__init__()
        self._store = store
        self._timeout = timeout

    def _seconds(self, timeout: datetime.timedelta | None) -> float:
        return self._timeout if timeout is None else min(self._timeout, timeout.total_seconds())

    # torch's Store takes str or bytes values (its stub says str; gloo's C++ side passes
    # bytes): both are accepted, and a str is stored as its UTF-8 bytes, as torch does.
    def set(self, key: str, value: str | bytes) -> None:
        self._store.set(key, _bytes(value))

    def get(self, key: str) -> bytes:
        return self._store.get(key, self._timeout)

    def add(self, key: str, amount: int) -> int:
        return self._store.add(key, amount)

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        self._store.wait(list(keys), self._seconds(timeout))

    def check(self, keys: Sequence[str]) -> bool:
        return self._store.check(list(keys))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._store.compare_set(key, _bytes(expected), _bytes(desired))

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(key)

    def num_keys(self) -> int:
        return self._store.num_keys()


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a``'s own memory. torch warns about read-only arrays (inputs of
    gathers and scatters may be); it only reads those, so the warning is silenced."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _as(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a`` viewed as the NumPy dtype the table chose (uint32 -> int32), no copy.
    (Built-in dtypes are singletons: the identity test is the cheap common case.)"""
    return a if a.dtype is dtype else a.view(dtype)


class TorchEngine(Engine):
    """One ProcessGroupGloo over the channel's members; every op waits on its Work."""

    name: ClassVar[str] = "torch"
    table = TORCH

    def __init__(self, group: Any, device: Any, interrupt: Callable[[], None]) -> None:
        self._group = group
        self.device = device
        self._interrupt = interrupt
        self._pending: Any = None
        self._reduce_opts: dict[Any, Any] = {}

    @classmethod
    def connect(cls, ctx: ChannelContext, p2p: DataChannel, device: Any, algorithm: str,
                interrupt: Callable[[], None], tag: int) -> TorchEngine:
        if algorithm != "ring":
            raise InvalidArgumentError(
                f"gloo all_reduce algorithm {algorithm!r} needs the pygloo engine: torch's "
                "ProcessGroupGloo runs ring only (set PROCGROUP_GLOO_ALGORITHM=ring, or use pygloo)")
        pgg = dist.ProcessGroupGloo
        if device is None:
            device = pgg.create_device(hostname=host_address(ctx))
        # torch's stub lacks ProcessGroupGloo._Options, the argument of its constructor's
        # options overload (unused-ignore: where torch is not installed, pgg is Any)
        opts = pgg._Options()  # type: ignore[attr-defined, unused-ignore]  # stub lacks _Options
        opts._timeout = datetime.timedelta(seconds=ctx.timeout)
        opts._devices = [device]
        store = _StoreAdapter(PrefixStore("gloo-torch", ctx.store), ctx.timeout)
        try:
            group = pgg(store, ctx.rank, ctx.size, opts)
        except ProcGroupError:
            raise
        except RuntimeError as exc:
            raise RendezvousError(f"gloo (torch): connecting the full mesh of {ctx.size} ranks failed: "
                                  f"{str(exc).strip()}") from exc
        return cls(group, device, interrupt)

    # ------------------------------------------------------------------ waiting
    def _run(self, work: Any) -> None:
        """Wait for ``work`` in slices; between them ``interrupt`` may end the wait."""
        self._pending = work
        while True:
            try:
                work.wait(_SLICE)
                break
            except RuntimeError:
                if work.is_completed():
                    # the slice ran out as the op ended, or the op failed: ask the Work
                    # itself (it returns, or raises the op's own error for the channel)
                    self._pending = None
                    work.wait()
                    return
            self._interrupt()
        self._pending = None

    def _opts(self, kind: type, **fields: Any) -> Any:
        opts = kind()
        for key, value in fields.items():
            setattr(opts, key, value)
        return opts

    def _reduce_op(self, op: Any) -> Any:
        opts = self._reduce_opts.get(op)
        if opts is None:
            opts = self._reduce_opts[op] = self._opts(dist.AllreduceOptions, reduceOp=op)
        return opts

    # ------------------------------------------------------------------ collectives
    def broadcast(self, buf: np.ndarray, src: int) -> None:
        self._run(self._group.broadcast([_tensor(buf)], self._opts(dist.BroadcastOptions, rootRank=src)))

    def all_reduce(self, a: np.ndarray, plan: Lowered) -> None:
        self._run(self._group.allreduce([_tensor(_as(a, plan.dtype))], self._reduce_op(plan.op)))

    def reduce(self, a: np.ndarray, scratch: np.ndarray | None, plan: Lowered, dst: int) -> None:
        # torch reduces in place and leaves partial results in non-roots' tensors: they
        # reduce a copy, so the caller's array stays as it was
        target = a
        if scratch is not None:
            np.copyto(scratch, a)
            target = scratch
        opts = self._opts(dist.ReduceOptions, rootRank=dst, reduceOp=plan.op)
        self._run(self._group.reduce([_tensor(_as(target, plan.dtype))], opts))

    def all_gather(self, src: np.ndarray, dest: np.ndarray) -> None:
        self._run(self._group._allgather_base(_tensor(dest), _tensor(src)))

    def gather(self, src: np.ndarray, dest: np.ndarray | None, dst: int) -> None:
        n = src.size
        outputs = [] if dest is None else [[_tensor(dest[i * n:(i + 1) * n]) for i in range(dest.size // n)]]
        self._run(self._group.gather(outputs, [_tensor(src)], self._opts(dist.GatherOptions, rootRank=dst)))

    def scatter(self, inputs: Sequence[np.ndarray] | None, out: np.ndarray, src: int) -> None:
        lists = [] if inputs is None else [[_tensor(a) for a in inputs]]
        self._run(self._group.scatter([_tensor(out)], lists, self._opts(dist.ScatterOptions, rootRank=src)))

    def reduce_scatter(self, whole: np.ndarray, out: np.ndarray, plan: Lowered) -> None:
        opts = self._opts(dist.ReduceScatterOptions, reduceOp=plan.op)
        self._run(self._group._reduce_scatter_base(_tensor(_as(out, plan.dtype)),
                                                   _tensor(_as(whole, plan.dtype)), opts))

    def close(self) -> None:
        group, self._group = self._group, None
        pending, self._pending = self._pending, None
        if group is not None and pending is not None and not pending.is_completed():
            _RETIRED.append(group)  # see the module docstring


__all__ = ["TorchEngine"]
