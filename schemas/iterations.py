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
STEADY_CLEAN = 8
"""Clean unprofiled iterations for a steady estimate of how much they vary: a coefficient of
variation from ``n`` samples has a standard error of about ``cv / sqrt(2 (n - 1))``, half of it
at 3, a fifth at 8."""
DEFAULT_WARMUP = STEADY_CLEAN + 2
"""The commands' default warm-up: ``STEADY_CLEAN`` clean iterations, with the cold first and the
profiler's warm-up step around them."""


def clean_unprofiled(iterations: Sequence[T], warmup: int) -> tuple[T, ...]:
    """The entries (wall times, or anything kept per iteration) of the warm-up iterations that
    ran neither cold nor under the profiler."""
    return tuple(iterations[1 : max(warmup - 1, 1)])


def call_signature(call) -> tuple:
    """What a logged call did, as iterations are compared by it: op, group label, bytes, peer."""
    return (call.op, call.label, call.bytes, call.peer)


def steady_from(windows: Sequence[tuple[int, int]], calls: Sequence) -> int:
    """The first iteration from which every iteration made the same process-group calls as the
    last one (op, group, bytes, peer of the calls that began in its ``(start, end)`` window):
    before it, a program's set-up and one-time calls (DDP rebuilds its buckets in iteration 1)."""
    signatures = [
        tuple(call_signature(c) for c in calls if start <= c.enter_ns < end) for start, end in windows
    ]
    if not signatures:
        return 0
    first = len(signatures) - 1
    while first > 0 and signatures[first - 1] == signatures[-1]:
        first -= 1
    return first
