"""A complete third-party backend in ~30 lines: send/recv over the job's Store.

It implements only ``do_send`` and ``do_recv`` (with any-source); every collective,
isend/irecv, groups and teardown come from :mod:`procgroup.backend`. Plugin authors
start from it (docs/plugins.md); procgroup's own tests install it as a real plugin.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np

from procgroup.backend import BackendSpec, ChannelContext, DataChannel, hookimpl
from procgroup.errors import CommTimeoutError


class StoreChannel(DataChannel):
    """Each message is one Store key: (src, dst, tag, per-pair sequence number)."""

    def __init__(self, ctx: ChannelContext) -> None:
        super().__init__(ctx)
        self._sent: defaultdict[tuple[int, int], int] = defaultdict(int)
        self._got: defaultdict[tuple[int, int], int] = defaultdict(int)

    def _key(self, src: int, dst: int, tag: int, seq: int) -> str:
        return f"m/{src}/{dst}/{tag}/{seq}"

    def do_send(self, array: Any, dst: int, tag: int = 0) -> None:
        self.check_usable()
        seq = self._sent[dst, tag]
        self._sent[dst, tag] += 1
        self.ctx.store.set(self._key(self.rank, dst, tag, seq), np.asarray(array).tobytes())

    def do_recv(self, array: Any, src: int | None = None, tag: int = 0) -> int:
        deadline = time.monotonic() + self.timeout
        while True:
            self.check_usable()
            for peer in range(self.size) if src is None else [src]:
                key = self._key(peer, self.rank, tag, self._got[peer, tag])
                if self.ctx.store.check([key]):
                    np.asarray(array).reshape(-1).view(np.uint8)[:] = np.frombuffer(self.ctx.store.get(key), np.uint8)
                    self.ctx.store.delete_key(key)
                    self._got[peer, tag] += 1
                    return peer
            if time.monotonic() > deadline:
                who = "any rank" if src is None else f"rank {src}"
                raise CommTimeoutError(f"recv from {who} timed out", op="recv", ranks=[] if src is None else [src])
            time.sleep(0.0005)


@hookimpl
def procgroup_backends() -> list[BackendSpec]:
    return [BackendSpec(name="storechan", loader=lambda: StoreChannel, description="send/recv over the Store")]


def register() -> None:
    """Setup hook for the conformance suite: register the channel at run time."""
    import procgroup

    procgroup.register_backend("storechan", StoreChannel)
