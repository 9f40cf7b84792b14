"""What a sweep measures: the ops, their buffers, sizes, iteration counts, bandwidths.

Sizes follow nccl-tests: ``nbytes`` is the size of the largest buffer of the op, so the
numbers line up with nccl-tests' tables. all_reduce/broadcast/reduce and ping-pong move
one buffer of ``nbytes``; all_gather's ``nbytes`` is the gathered output (each rank sends
``nbytes / n``); reduce_scatter's is the input (each rank keeps ``nbytes / n``);
all_to_all's is each rank's send buffer (``nbytes / n`` to every peer). Sizes are rounded
down to whole elements, and for these three chunked ops to a multiple of ``n * itemsize``
so every chunk is whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from procgroup.errors import InvalidArgumentError


@dataclass(frozen=True)
class OpInfo:
    """One benchmarked op: its name and the nccl-tests bus-bandwidth factor for n ranks."""

    name: str
    bus_factor: Callable[[int], float]
    summary: str


OPS: dict[str, OpInfo] = {
    op.name: op
    for op in (
        OpInfo("all_reduce", lambda n: 2 * (n - 1) / n, "sum into every rank's buffer, in place"),
        OpInfo("broadcast", lambda n: 1.0, "rank 0's buffer to every rank"),
        OpInfo("reduce", lambda n: 1.0, "sum into rank 0's buffer"),
        OpInfo("all_gather", lambda n: (n - 1) / n, "every rank's nbytes/n chunk to every rank"),
        OpInfo("reduce_scatter", lambda n: (n - 1) / n, "sum of chunk i lands on rank i"),
        OpInfo("all_to_all", lambda n: (n - 1) / n, "chunk j of rank i goes to rank j"),
        OpInfo("pingpong", lambda n: 1.0, "rank 0 -> rank 1 -> rank 0 with send/recv; time = half round trip"),
    )
}

#: Other spellings accepted by --op.
OP_ALIASES = {
    "allreduce": "all_reduce", "bcast": "broadcast", "allgather": "all_gather",
    "reducescatter": "reduce_scatter", "alltoall": "all_to_all", "ping_pong": "pingpong",
    "send_recv": "pingpong", "sendrecv": "pingpong", "p2p": "pingpong",
}

DTYPES = ("float32", "float64", "int32", "int64")

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """``"256M"`` -> 268435456. Units are powers of two (K, M, G; KiB/MB spellings too)."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise InvalidArgumentError(f"bad size {text!r}: use a number with an optional unit K, M or G (e.g. 64M)")
    value = float(m.group(1)) * _UNITS[unit]
    if value != int(value):
        raise InvalidArgumentError(f"bad size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """1048576 -> '1 MiB'; exact binary units where they fit, else bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def parse_ops(text: str) -> list[str]:
    """``"all_reduce,bcast"`` -> canonical names; ``"all"`` -> every op."""
    names: list[str] = []
    for raw in str(text).split(","):
        key = raw.strip().lower().replace("-", "_")
        if not key:
            continue
        if key == "all":
            names.extend(n for n in OPS if n not in names)
            continue
        key = OP_ALIASES.get(key, key)
        if key not in OPS:
            raise InvalidArgumentError(f"unknown op {raw.strip()!r}; choose from: {', '.join(OPS)} (or all)")
        if key not in names:
            names.append(key)
    if not names:
        raise InvalidArgumentError("--op: give at least one op")
    return names


def size_sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """min_bytes, min_bytes*factor, ... up to and including max_bytes (nccl-tests' -b -e -f)."""
    if min_bytes < 1:
        raise InvalidArgumentError(f"--min-bytes must be at least 1, got {min_bytes}")
    if max_bytes < min_bytes:
        raise InvalidArgumentError(f"--max-bytes ({max_bytes}) is below --min-bytes ({min_bytes})")
    if not factor > 1:
        raise InvalidArgumentError(f"--factor must be greater than 1, got {factor}")
    sizes, size = [], float(min_bytes)
    while size <= max_bytes * (1 + 1e-9):
        sizes.append(round(size))
        size *= factor
    return sizes


CHUNKED_OPS = ("all_gather", "reduce_scatter", "all_to_all")


def round_size(op: str, nbytes: int, world_size: int, itemsize: int) -> int:
    """Round down to whole elements; chunked ops to whole chunks (at least one element per rank)."""
    unit = world_size * itemsize if op in CHUNKED_OPS else itemsize
    return max(unit, nbytes // unit * unit)


def effective_sizes(op: str, sizes: list[int], world_size: int, itemsize: int) -> list[int]:
    """Rounded sizes in order, duplicates (several tiny sizes rounding alike) dropped."""
    out: list[int] = []
    for s in sizes:
        r = round_size(op, s, world_size, itemsize)
        if r not in out:
            out.append(r)
    return out


def auto_iters(nbytes: int) -> int:
    """Timed iterations when --iters is not given: many for small sizes, 5 for the largest."""
    return min(50, max(5, 2**28 // max(nbytes, 1)))


def auto_warmup(iters: int) -> int:
    return max(2, math.ceil(iters / 10))


def bandwidths(op: str, nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s), nccl-tests definitions."""
    if seconds <= 0:
        return math.nan, math.nan
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * OPS[op].bus_factor(world_size)


# --------------------------------------------------------------------- buffers
@dataclass
class Buffers:
    """Host arrays for one (op, size): ``send``/``recv`` plus per-rank chunk views of each.

    Every variant of a sweep reuses the same buffers (they are refilled before each
    variant's correctness check), so memory stays at about twice the largest size.
    """

    op: str
    send: np.ndarray
    recv: np.ndarray
    send_chunks: list[np.ndarray]
    recv_chunks: list[np.ndarray]

    @property
    def count(self) -> int:
        return int(max(self.send.size, self.recv.size))


def make_buffers(op: str, nbytes: int, dtype: np.dtype, world_size: int, xp: Any = np) -> Buffers:
    """Allocate the buffers ``op`` needs for ``nbytes`` (already rounded), with array
    module ``xp`` (NumPy; CuPy for a GPU sweep)."""
    count = nbytes // dtype.itemsize
    chunk = count // world_size
    if op in ("all_reduce", "broadcast", "reduce", "pingpong"):
        buf = xp.zeros(count, dtype)
        return Buffers(op, buf, buf, [], [])
    if op == "all_gather":
        send, recv = xp.zeros(chunk, dtype), xp.zeros(count, dtype)
    elif op == "reduce_scatter":
        send, recv = xp.zeros(count, dtype), xp.zeros(chunk, dtype)
    else:  # all_to_all
        send, recv = xp.zeros(count, dtype), xp.zeros(count, dtype)

    def split(a: np.ndarray) -> list[np.ndarray]:
        return [a[i * chunk:(i + 1) * chunk] for i in range(world_size)] if a.size == count else []

    return Buffers(op, send, recv, split(send), split(recv))


def fill_for_check(b: Buffers, rank: int, world_size: int) -> None:
    """Put known values in: every rank's data is rank+1 (all_to_all: 100*rank + dest)."""
    if b.op == "all_to_all":
        for j, c in enumerate(b.send_chunks):
            c[...] = 100 * rank + j
        b.recv[...] = -1
        return
    b.send[...] = rank + 1
    if b.recv is not b.send:
        b.recv[...] = -1


def check_result(b: Buffers, rank: int, world_size: int) -> str | None:
    """After one op on :func:`fill_for_check` data: None when right, else what is wrong."""
    n = world_size
    total = n * (n + 1) / 2
    expected: list[tuple[np.ndarray, float]] = []
    if b.op == "all_reduce":
        expected = [(b.recv, total)]
    elif b.op == "broadcast":
        expected = [(b.recv, 1)]
    elif b.op == "reduce":
        expected = [(b.recv, total)] if rank == 0 else []  # others' buffers may serve as scratch
    elif b.op == "all_gather":
        expected = [(c, j + 1) for j, c in enumerate(b.recv_chunks)]
    elif b.op == "reduce_scatter":
        expected = [(b.recv, total)]
    elif b.op == "all_to_all":
        expected = [(c, 100 * j + rank) for j, c in enumerate(b.recv_chunks)]
    elif b.op == "pingpong":
        expected = [(b.recv, 1)] if rank in (0, 1) else []
    for i, (arr, want) in enumerate(expected):
        if arr.size and not np.all(arr == want):
            bad = arr[arr != want]
            return f"part {i}: expected every element == {want:g}, found {bad[:4].tolist()} ..."
    return None
