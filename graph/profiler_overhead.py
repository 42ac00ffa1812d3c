"""Take the profiler's own cost out of the templates: predict the iteration the job runs unprofiled.

Templates are measured in profiled iterations, and on CPU the profiler (shapes, memory events,
Execution Trace, one callback per op) makes an iteration 1.4-2.6x as long as without it. The
capture also times the unprofiled warm-up iterations of the same rank, so each captured rank
gives its own ratio ``unprofiled / profiled`` steady iteration time. The build multiplies the
rank's compute durations and gaps by it (communication durations come from the comm model and
are left alone). Scaling every op by one factor keeps the iteration total of the captured rank
exact; what it cannot know is how the overhead splits between ops (it is closer to a constant
per op than to a share of each op's time).

Which warm-up iterations are clean: the first runs cold (allocator, caches, lazy init) and the
last one is the profiler's warm-up step, so ``iteration_ns[1 : warmup - 1]``; a capture needs
``warmup >= 3`` to have one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from prism.graph import op_table as ot
from prism.graph.templates import RoleTemplate, Segment

T = TypeVar("T")

MIN_WARMUP = 3
"""Warm-up iterations a capture needs for one clean unprofiled iteration."""


@dataclass(frozen=True, kw_only=True)
class TimeScale:
    """How much faster a captured rank ran without the profiler."""

    rank: int
    """Captured rank."""
    unprofiled_ns: float
    """Median of its clean unprofiled iterations."""
    profiled_ns: float
    """Median of its profiled iterations."""
    clean_iterations: int
    """Unprofiled iterations the median is over."""

    @property
    def factor(self) -> float:
        return self.unprofiled_ns / self.profiled_ns

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "factor": round(self.factor, 6),
            "unprofiled_ms": round(self.unprofiled_ns / 1e6, 3),
            "profiled_ms": round(self.profiled_ns / 1e6, 3),
            "clean_iterations": self.clean_iterations,
        }


def clean_unprofiled(iterations: Sequence[T], warmup: int) -> tuple[T, ...]:
    """The entries (wall times, or anything kept per iteration) of the warm-up iterations that
    ran neither cold nor under the profiler."""
    return tuple(iterations[1 : max(warmup - 1, 1)])


def time_scale(rank: int, iteration_ns: tuple[int, ...], warmup: int) -> TimeScale | None:
    """The rank's unprofiled/profiled ratio, or None without a clean unprofiled iteration."""
    clean = clean_unprofiled(iteration_ns, warmup)
    profiled = iteration_ns[warmup:]
    if not clean or not profiled:
        return None
    return TimeScale(
        rank=rank,
        unprofiled_ns=float(statistics.median(clean)),
        profiled_ns=float(statistics.median(profiled)),
        clean_iterations=len(clean),
    )


def _scaled(segment: Segment, factor: float) -> Segment:
    units = segment.units.copy()
    compute = ~units[ot.IS_COMM].fillna(False).to_numpy(dtype=bool)
    dur = units[ot.DUR_NS].to_numpy(dtype=np.float64)
    units[ot.DUR_NS] = np.where(compute, np.round(dur * factor), dur).astype(np.int64)
    units[ot.GAP_NS] = np.round(units[ot.GAP_NS].to_numpy(dtype=np.float64) * factor).astype(np.int64)
    return replace(segment, units=units)


def scale_template(template: RoleTemplate, factor: float) -> RoleTemplate:
    """``template`` with every compute duration and every gap multiplied by ``factor``."""
    segments = {kind: _scaled(segment, factor) for kind, segment in template.segments.items()}
    return replace(template, segments=segments)
