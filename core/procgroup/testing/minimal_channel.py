"""A complete third-party backend in ~30 lines: send/recv over the job's Store.

It implements only ``do_send`` and ``do_recv`` (with any-source); every collective,
isend/irecv, groups and teardown come from :mod:`procgroup.backend`. Plugin authors
start from it (docs/plugins.md); procgroup's own tests install it as a real plugin.
"""

import time
from collections import defaultdict

import numpy as np

from procgroup.backend import BackendSpec, DataChannel, hookimpl
from procgroup.errors import CommTimeoutError


class StoreChannel(DataChannel):
    """Each message is one Store key: (src, dst, tag, per-pair sequence number)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self._sent = defaultdict(int)
        self._got = defaultdict(int)

    def _key(self, src, dst, tag, seq):
        return f"m/{src}/{dst}/{tag}/{seq}"

    def do_send(self, array, dst, tag=0):
        self.check_usable()
        seq = self._sent[dst, tag]
        self._sent[dst, tag] += 1
        self.ctx.store.set(self._key(self.rank, dst, tag, seq), np.asarray(array).tobytes())

    def do_recv(self, array, src=None, tag=0):
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
def procgroup_backends():
    return [BackendSpec(name="storechan", loader=lambda: StoreChannel, description="send/recv over the Store")]


def register():
    """Setup hook for the conformance suite: register the channel at run time."""
    import procgroup

    procgroup.register_backend("storechan", StoreChannel)
