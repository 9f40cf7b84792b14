"""Timing shared by the bench/ scripts: contenders take turns, round by round.

Machine noise on a small shared host comes in bursts of milliseconds; running every
contender in each round (alternating who goes first) and taking the median over rounds
lets a burst hit all of them alike instead of deciding a ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved_medians(variants: dict[str, Callable[[Any], None]], arg: Any, *, rounds: int, iters: int,
                        barrier: Callable[[], None], warmup: int = 1) -> dict[str, float]:
    """Median over ``rounds`` of each variant's seconds per call, ``iters`` calls per round."""
    for fn in variants.values():
        for _ in range(warmup):
            fn(arg)
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in order:
            fn = variants[name]
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn(arg)
            per_round[name].append((time.perf_counter() - t0) / iters)
    return {name: statistics.median(times) for name, times in per_round.items()}
