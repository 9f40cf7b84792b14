"""The ``torch-gloo`` comparison: torch.distributed's gloo backend on the same buffers.

torch is optional and imported only here. Tensors are ``torch.from_numpy`` views of the
sweep's NumPy buffers (no copies). Rank 0 hosts a torch TCPStore on a free port and
tells the others the port over procgroup's control group.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from typing import Any

from ._sweep import Buffers
from ._variants import Call, Variant, pingpong_call

log = logging.getLogger(__name__)


def torch_missing() -> str | None:
    """Why torch.distributed with gloo cannot be used here (None when it can)."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return (f"torch is not importable ({exc}); torch 2.13 CPU is installed for CPython 3.11 "
                "by scripts/setup-bench-venv.sh (run procgroup-bench from .venv-bench)")
    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch build has no torch.distributed gloo backend"
    return None


class TorchGlooVariant(Variant):
    """torch.distributed.init_process_group('gloo') over its own TCPStore."""

    label = "torch-gloo"

    def __init__(self, rank: int, world_size: int, host: str, timeout: float,
                 share: Callable[[Any], Any]) -> None:
        """``share(value)`` returns rank 0's ``value`` on every rank (the control group's broadcast)."""
        import torch.distributed as dist

        if host.startswith("127.") and "GLOO_SOCKET_IFNAME" not in os.environ:
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo would pick the hostname's address
        td = datetime.timedelta(seconds=timeout)
        if rank == 0:
            self._store = dist.TCPStore(host, 0, world_size, is_master=True, timeout=td, wait_for_workers=False)
            share(self._store.port)
        else:
            port = share(None)
            self._store = dist.TCPStore(host, port, world_size, is_master=False, timeout=td)
        dist.init_process_group("gloo", store=self._store, rank=rank, world_size=world_size, timeout=td)
        self._dist = dist

    def unsupported(self, op: str) -> str | None:
        return None  # torch raises for what gloo lacks; the sweep records it as n/a

    def prepare(self, op: str, b: Buffers, rank: int, world_size: int) -> Call:
        import torch

        dist = self._dist
        t = torch.from_numpy
        if op == "all_reduce":
            buf = t(b.recv)
            return lambda: dist.all_reduce(buf)
        if op == "broadcast":
            buf = t(b.recv)
            return lambda: dist.broadcast(buf, 0)
        if op == "reduce":
            buf = t(b.recv)
            return lambda: dist.reduce(buf, 0)
        if op == "all_gather":
            outs, inp = [t(c) for c in b.recv_chunks], t(b.send)
            return lambda: dist.all_gather(outs, inp)
        if op == "reduce_scatter":
            out, ins = t(b.recv), [t(c) for c in b.send_chunks]
            return lambda: dist.reduce_scatter(out, ins)
        if op == "all_to_all":
            out, inp = t(b.recv), t(b.send)  # gloo implements only the single-tensor form
            return lambda: dist.all_to_all_single(out, inp)
        if op == "pingpong":
            buf = t(b.recv)
            return pingpong_call(rank, lambda peer: dist.send(buf, peer), lambda peer: dist.recv(buf, peer))
        raise ValueError(op)

    def barrier(self) -> None:
        self._dist.barrier()

    def close(self) -> None:
        self._dist.destroy_process_group()

