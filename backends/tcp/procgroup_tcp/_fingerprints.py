"""Fingerprinted collectives over the sockets: every frame says which op sent it.

A collective run over point-to-point (the base's algorithms, the pipelined ring)
registers its fingerprint under its collective tag in a registry its channel shares
with the root TcpChannel. Sends of that tag carry the fingerprint in the frame
header; the receiving channel compares it with its own for the tag (when the frame
arrives, or when a receive takes it off the unexpected queue), so ranks that
disagree get a MismatchError, never wrong data. A 0-byte collective, which the
algorithms would skip, runs a barrier under its fingerprint instead, so a 0-byte vs
non-0 disagreement is found too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from procgroup.algorithms import direct
from procgroup.backend import Fingerprint
from procgroup.ops import ReduceOp

__all__ = ["Fingerprinted"]

NO_ROOT = -1  # procgroup.backend.Fingerprint's "no root"


class Fingerprinted:
    """Mixin of TcpChannel and its sub-channels: ``_fingerprinted`` runs a collective
    with its fingerprint registered under the tag it draws (``next_collective_tag``)."""

    #: the frames carry fingerprints: PROCGROUP_DEBUG=DETAIL needs no exchange of its own
    checks_agreement = True
    _fps: dict[int, bytes]
    _fp_seq: int = 0
    _pending_fp: bytes | None = None
    _active_tag: int = -1
    _fp_cache: dict[tuple[Any, ...], bytes]

    def _init_fingerprints(self, registry: dict[int, bytes]) -> None:
        self._fps = registry
        self._fp_cache = {}

    def _fingerprint(self, op: str, array: Any, root: int, reduce_op: ReduceOp | None) -> bytes:
        """The packed fingerprint of this channel's next collective (cached but for ``seq``)."""
        if array is None:
            key: tuple[Any, ...] = (op, None, 0, root, reduce_op)
        else:
            key = (op, array.dtype, array.nbytes, root, reduce_op)
        packed = self._fp_cache.get(key)
        if packed is None:
            if len(self._fp_cache) >= 1024:
                self._fp_cache.clear()
            packed = self._fp_cache[key] = Fingerprint.of(op, 0, array, root=root, reduce_op=reduce_op).pack()
        seq = self._fp_seq
        self._fp_seq = seq + 1
        return packed[:8] + (seq & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little") + packed[16:]

    def next_collective_tag(self) -> int:
        tag: int = super().next_collective_tag()  # type: ignore[misc]
        fp = self._pending_fp
        if fp is not None:
            self._pending_fp = None
            self._fps[tag] = fp
            self._active_tag = tag
        return tag

    def _fingerprinted(self, op: str, array: Any, fn: Callable[..., None], *args: Any,
                       root: int = NO_ROOT, reduce_op: ReduceOp | None = None) -> None:
        """Run ``fn(*args)`` (a collective over the sockets) under its fingerprint."""
        self._pending_fp = self._fingerprint(op, array, root, reduce_op)
        try:
            if self.size > 1 and (array is None or array.nbytes == 0):  # type: ignore[attr-defined]
                direct.barrier(self, self.next_collective_tag())  # type: ignore[arg-type]
            else:
                fn(*args)
        finally:
            self._pending_fp = None
            self._fps.pop(self._active_tag, None)
