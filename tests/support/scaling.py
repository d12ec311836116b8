"""Linear time asserted as growth, not as a budget in seconds.

A slow or busy machine slows a small run and a large run alike, so the ratio of their CPU
times holds where an absolute limit fails (CI once failed "10 MB in under 2 s" at 2.07 s).
Absolute speed is measured in ``bench/``, not here.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The large input is FACTOR times the small one. Linear work grows about 8x (a little more
# when the large input no longer fits the caches); quadratic work grows 64x. MAX_GROWTH
# separates the two with room for noise.
FACTOR = 8
MAX_GROWTH = 24.0
# A small run this short is mostly timer and scheduler noise: it counts as this long.
FLOOR_SECONDS = 0.005


def cpu_seconds(work: Callable[[], object], repeats: int) -> float:
    """The best CPU time of ``repeats`` runs of work, with the collector paused."""
    best = math.inf
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            started = time.process_time()
            work()
            best = min(best, time.process_time() - started)
    finally:
        if enabled:
            gc.enable()
    return best


def growth(make: Callable[[int], T], run: Callable[[T], object], size: int, *,
           factor: int = FACTOR, repeats: int = 3) -> float:
    """CPU time of run(make(size * factor)) over run(make(size)), inputs built untimed:
    the small run's best of ``repeats``, the large run once (its noise is a small part)."""
    small_input, large_input = make(size), make(size * factor)
    small = cpu_seconds(lambda: run(small_input), repeats)
    large = cpu_seconds(lambda: run(large_input), 1)
    return large / max(small, FLOOR_SECONDS)


def assert_linear(make: Callable[[int], T], run: Callable[[T], object], size: int, *,
                  factor: int = FACTOR, repeats: int = 3) -> None:
    """Fail when run's CPU time grows faster than linearly from size to size * factor."""
    ratio = growth(make, run, size, factor=factor, repeats=repeats)
    limit = MAX_GROWTH * factor / FACTOR
    assert ratio < limit, (
        f"{factor}x the input took {ratio:.1f}x the CPU time (linear is ~{factor}x, "
        f"the limit {limit:.0f}x)")
