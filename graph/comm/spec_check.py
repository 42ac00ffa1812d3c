"""Is a cluster spec still this machine's? Time the calls now and compare them with its prices.

A spec fitted on a shared VM goes stale: the price of a small gloo collective there moves by a
fifth or more within hours, and a prediction priced by the old spec moves with it (a
tensor-parallel job's many small all-reduces most). ``prism-calibrate --check SPEC`` times the
same microbenchmark as a calibration and prices each point with the spec's measured table (the
points it was calibrated on, ``prism-calibrate --table``), and says per op class how far what
the calls cost now is from what they cost then: beyond the tolerance, recalibrate before
trusting a prediction. A spec of an α-β line alone is refused: the line misses single points of
some classes by a third or more for good, which no check can tell from a drift.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from prism.graph.comm.bench import run_benchmark
from prism.graph.comm.calibrate import CalibrationConfig, Check, check_samples
from prism.peers.comm_model import op_class
from prism.schemas.cluster import ClusterSpec

DEFAULT_TOLERANCE = 0.25
"""How far (relative) an op class's median may move before a spec counts as stale: on a 2-vCPU VM
three checks of a fresh spec at ``CHECK_REPS`` moved each class by at most 21 %, and a spec hours
old priced small all-reduces 20-50 % off."""
CHECK_REPS = 30
"""Timed repetitions a point when checking: at a calibration's 9 a fresh spec's classes moved by
up to 44 % on a 2-vCPU VM, at 30 by up to 21 %."""
MIN_POINTS = 3
"""Points an op class needs to be judged: one point's time is one spell of the machine."""


@dataclass(frozen=True, kw_only=True)
class SpecDrift:
    """Each timed point against a spec's price, and what that says of the spec."""

    checks: tuple[Check, ...]
    """Every point timed now that the spec's measured table holds, with the spec's price."""
    tolerance: float
    """The largest relative move of an op class's median that keeps the spec current."""

    @property
    def by_class(self) -> dict[str, float]:
        """Per op class, the median of (now / the spec's price) over its points."""
        ratios: dict[str, list[float]] = defaultdict(list)
        for c in self.checks:
            if c.predicted_s > 0:
                ratios[op_class(c.sample.op)].append(c.sample.seconds / c.predicted_s)
        return {cls: statistics.median(r) for cls, r in sorted(ratios.items())}

    @property
    def judged(self) -> tuple[str, ...]:
        """The op classes with ``MIN_POINTS`` or more points."""
        counts = Counter(op_class(c.sample.op) for c in self.checks if c.predicted_s > 0)
        return tuple(cls for cls in self.by_class if counts[cls] >= MIN_POINTS)

    @property
    def stale(self) -> tuple[str, ...]:
        """The judged op classes whose calls moved beyond the tolerance."""
        return tuple(cls for cls in self.judged if abs(self.by_class[cls] - 1) > self.tolerance)


def check_spec(
    spec: ClusterSpec, config: CalibrationConfig, tolerance: float = DEFAULT_TOLERANCE
) -> SpecDrift:
    """Time ``config``'s microbenchmark now, as a calibration would, and price each point with ``spec``."""
    if tolerance <= 0:
        raise ValueError(f"the tolerance must be above 0, got {tolerance:g}")
    if not spec.measured:
        raise ValueError(
            f"the spec {spec.name!r} has no measured table: its prices are an α-β line through the calibration's "
            "points, whose misfit cannot be told from a drift; calibrate with --table to check the spec later"
        )
    samples = run_benchmark(
        max_procs=config.max_procs, sizes=config.sizes, ops=config.ops, reps=config.reps,
        calls_per_rep=config.calls_per_rep, warmup=config.warmup, timeout_s=config.timeout_s,
        compute_between_s=config.compute_between_ms / 1e3,
    )  # fmt: skip
    # Only a point the table holds is compared with what it cost then; any other would be priced
    # by the line or an interpolation, whose misfit is no drift.
    held = [s for s in samples if s.bytes in _table_sizes(spec, op_class(s.op), s.group_size)]
    if not held:
        raise ValueError(
            f"the spec {spec.name!r}'s measured table holds none of the points timed: give the --ops, --sizes and "
            "--max-procs it was calibrated with"
        )
    return SpecDrift(checks=check_samples(spec, held), tolerance=tolerance)


def _table_sizes(spec: ClusterSpec, cls: str, group_size: int) -> set[int]:
    """The bytes of the points ``spec``'s measured table holds for ``cls`` at ``group_size``."""
    return {n for n, _ in spec.measured.get(cls, {}).get(group_size, ())}
