"""Which iterations of a captured or replayed run are which.

A run does ``warmup`` unprofiled iterations, then the profiled ones. Of the warm-up, the first
runs cold (allocator, caches, lazy init) and the last one is the profiler's own warm-up step, so
the clean unprofiled iterations are ``[1 : warmup - 1]``: a run needs ``warmup >= 3`` to have one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

MIN_WARMUP = 3
"""Warm-up iterations a run needs for one clean unprofiled iteration."""


def clean_unprofiled(iterations: Sequence[T], warmup: int) -> tuple[T, ...]:
    """The entries (wall times, or anything kept per iteration) of the warm-up iterations that
    ran neither cold nor under the profiler."""
    return tuple(iterations[1 : max(warmup - 1, 1)])
