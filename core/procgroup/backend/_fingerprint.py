"""Op fingerprints: what a rank is about to do, compact enough to ride in every frame.

Ranks that disagree (all_reduce on one, broadcast on another; different sizes, dtypes,
roots or reduce ops) must get a MismatchError naming both sides, never wrong data or a
hang. A fingerprint packs into 32 bytes so transports can carry it in their headers
(tcp) or exchange it over a host channel before a collective (PROCGROUP_DEBUG=DETAIL).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MismatchError
from ..ops import ReduceOp
from ._context import OPS

_OP_CODES = {name: i + 1 for i, name in enumerate(OPS)}
_OP_NAMES = {code: name for name, code in _OP_CODES.items()}
_REDUCE_CODES = {op: i + 1 for i, op in enumerate(ReduceOp)}
_REDUCE_NAMES = {code: op for op, code in _REDUCE_CODES.items()}
#: op code, dtype char, reduce op code, pad, root, seq, nbytes
_PACKED = struct.Struct("<BcBxiQQ8x")
SIZE = _PACKED.size  # 32 bytes
NO_ROOT = -1


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """One op as a rank sees it. ``seq`` counts the channel's collectives."""

    op: str
    seq: int = 0
    dtype: str = "B"  # numpy dtype char ("B" for ops that move bytes)
    nbytes: int = 0
    root: int = NO_ROOT
    reduce_op: ReduceOp | None = None

    @classmethod
    def of(cls, op: str, seq: int, array: Any = None, *, root: int = NO_ROOT,
           reduce_op: ReduceOp | None = None) -> Fingerprint:
        """The fingerprint of ``op`` on ``array`` (any array with dtype and nbytes, or None)."""
        if array is None:
            return cls(op, seq, "B", 0, root, reduce_op)
        return cls(op, seq, np.dtype(array.dtype).char, int(array.nbytes), root, reduce_op)

    def pack(self) -> bytes:
        return _PACKED.pack(_OP_CODES.get(self.op, 0), self.dtype.encode()[:1] or b"B",
                            _REDUCE_CODES.get(self.reduce_op, 0) if self.reduce_op is not None else 0,
                            self.root, self.seq, self.nbytes)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> Fingerprint:
        code, dtype, reduce_code, root, seq, nbytes = _PACKED.unpack(data)
        return cls(_OP_NAMES.get(code, f"op#{code}"), seq, dtype.decode("latin-1"), nbytes, root,
                   _REDUCE_NAMES.get(reduce_code))

    def describe(self) -> str:
        """In words, for error messages: ``all_reduce #7 of 16 bytes of float32 with SUM``."""
        try:
            dtype = str(np.dtype(self.dtype))
        except (TypeError, ValueError, SyntaxError):  # a peer's code; numpy parses "," as a record spec
            dtype = repr(self.dtype)
        parts = [f"{self.op} #{self.seq} of {self.nbytes} bytes of {dtype}"]
        if self.root != NO_ROOT:
            parts.append(f"root {self.root}")
        if self.reduce_op is not None:
            parts.append(f"with {self.reduce_op.name}")
        return ", ".join(parts)


def mismatch(mine: Fingerprint, theirs: Fingerprint, my_rank: int, their_rank: int) -> MismatchError:
    """The error both sides raise: names the ranks (world ranks) and what each called."""
    return MismatchError(
        f"ranks disagree: rank {my_rank} called {mine.describe()}, but rank {their_rank} called "
        f"{theirs.describe()}; every rank of the group must call the same collectives in the "
        f"same order with the same sizes, dtypes, roots and reduce ops",
        ranks=sorted({my_rank, their_rank}),
    )



__all__ = ["Fingerprint", "NO_ROOT", "SIZE", "mismatch"]
