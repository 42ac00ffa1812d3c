"""Take the profiler's own cost out of the templates: predict the iteration the job runs unprofiled.

Templates are measured in profiled iterations, and on CPU the profiler (shapes, memory events,
Execution Trace, one callback per op) makes an iteration several times as long as without it. The
capture also times the unprofiled warm-up iterations of the same rank, so each captured rank
gives its own ratio ``unprofiled / profiled`` of its steady own time, and the build multiplies
the rank's compute durations and gaps by it (communication durations come from the comm model
and are left alone).

The profiler's cost is closer to a constant per op than to a share of each op's time, so one
factor per role leaves a phase of many tiny ops too long and one of a few big ops too short:
Adam's step (thousands of tiny ops an iteration) keeps several times its real time under the
role's factor, and in a replay the real rank then waits for its virtual peers' long step. Captures
record each top-level block's own time in every iteration (``RankResult.phase_ns``,
``prism.capture.phase_timer``), so on CPU every unit is scaled by its own *phase's* ratio —
forward, backward, each kind of transfer, p2p wait, gradient sync, optimizer step, each with the
glue that leads into it as the trace's segments hold it, and the glue before the first block and
after the last — and only a phase too short to measure (or a capture without phase times) falls back to the
role's factor. On CUDA the phase spans are host time while the device runs ahead of it, so the
role's factor (whole iterations, synchronised) stays.

A process-group call's own time is left to the comm model, but what that time is differs by
device. On CPU a blocking call is the collective (gloo runs it on the host, and the model's price
was measured on such calls), so its captured time is dropped. On CUDA the host only launches the
call and the device runs the collective: the captured time is the launch, host work the model
does not price, and it stays, scaled like compute, in the gap before the call's node (the role's
factor is over iterations that include it). A call made asynchronously on CPU is host work too,
the post (``host_kept``): some 30-230 µs of a stage's time per posted transfer; for a DDP bucket's
all-reduce the issue and the program's thread giving way to the call's own work on the same cores
(the host work of virtual calls, ``prism.peers.host_work``; 0.5-0.8 ms a call in a 14 ms
model's capture on a 2-vCPU VM). gloo's post begins the
call and the calibrated price runs from its start: so the post runs *after* the call's node
(``ot.POST_NS``, a node of its own, ``compose.finish_nodes``), the call starting where the
program posts it and the program going on once its post is done.

Which warm-up iterations are clean is ``prism.schemas.iterations.clean_unprofiled``.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.templates import POST, PRE, RoleTemplate, Segment
from prism.schemas.annotations import GLUE
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import RankResult


class Correction(enum.StrEnum):
    """How the build takes the profiler's cost out of the templates."""

    PHASE = "phase"
    """Each phase by its own ratio (CPU captures that timed their phases), else as ROLE."""
    ROLE = "role"
    """One ratio per captured role, over whole iterations."""
    NONE = "none"
    """Templates as profiled."""


MIN_PHASE_NS = 50_000
"""Profiled own time per iteration below which a phase keeps the role's factor: a ratio of a few
timer readings is noise, and a phase that short weighs nothing in the iteration."""


@dataclass(frozen=True, kw_only=True)
class TimeScale:
    """How much faster a captured rank ran without the profiler, as a whole and by phase."""

    rank: int
    """Captured rank."""
    unprofiled_ns: float
    """Median own time of its clean unprofiled iterations."""
    profiled_ns: float
    """Mean own time of its profiled iterations: the templates are means over them, so the factor
    takes a template to the unprofiled median however unevenly the few profiled iterations ran."""
    clean_iterations: int
    """Unprofiled iterations the median is over."""
    phase_factors: Mapping[str, float] = field(default_factory=dict)
    """Unprofiled median / profiled mean own time of each phase (``annotations.block_kind``, and
    ``GLUE``); empty: the role's factor for every unit. ``fitted`` takes a phase's profiled time
    from the templates instead."""
    phase_unprofiled_ns: Mapping[str, float] = field(default_factory=dict)
    """Unprofiled median own time per iteration of each phase in ``phase_factors``."""
    launches: bool = False
    """The rank's process-group calls are launched onto a device (CUDA): their captured time is
    host work that stays in the graph, before each call's node (with or without a time scale:
    this records it beside the factors)."""

    @property
    def factor(self) -> float:
        """The role's factor: whole iterations."""
        return self.unprofiled_ns / self.profiled_ns

    def factor_of(self, kind: str | None) -> float:
        """The factor of a unit of block kind ``kind`` (None: glue outside every block)."""
        return self.phase_factors.get(GLUE if kind is None else kind, self.factor)

    def fitted(
        self, template_ns: Mapping[str, float], absorbs: Mapping[str, Sequence[str]] | None = None
    ) -> TimeScale:
        """This scale with each phase of ``template_ns`` (the profiled own time per iteration the
        templates hold of it: their units' means) scaled to its unprofiled median, so that the
        graph holds exactly what the timer measured unprofiled; with the phases ``absorbs`` names
        for it added (a block with no op of its own, a gradient sync without data parallelism:
        its time is in the gap before the next block's first op). The timer and the trace can cut
        an iteration differently: the timer's iteration is the whole step, the trace's only its
        ``prism:iter`` mark (the loss read back after the mark, the step's start before it are
        the timer's glue alone, a few hundred µs of a profiled step); and a program's units
        between two blocks are the next block's in the timer, glue in the trace. A phase the
        templates hold too little of to measure keeps its factor."""
        factors, absorbs = dict(self.phase_factors), absorbs or {}
        for kind, ns in template_ns.items():
            unprofiled = self.phase_unprofiled_ns.get(kind)
            if unprofiled is not None and ns >= MIN_PHASE_NS:
                extra = sum(self.phase_unprofiled_ns.get(other, 0.0) for other in absorbs.get(kind, ()))
                factors[kind] = (unprofiled + extra) / ns
        return replace(self, phase_factors=factors)

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "factor": round(self.factor, 6),
            "unprofiled_ms": round(self.unprofiled_ns / 1e6, 3),
            "profiled_ms": round(self.profiled_ns / 1e6, 3),
            "clean_iterations": self.clean_iterations,
            "phase_factors": {kind: round(f, 6) for kind, f in sorted(self.phase_factors.items())},
            "phase_unprofiled_ms": {
                kind: round(ns / 1e6, 6) for kind, ns in sorted(self.phase_unprofiled_ns.items())
            },
            "launches": self.launches,
        }


def phase_factors(phase_ns: Sequence[Mapping[str, int]], warmup: int) -> dict[str, float]:
    """Unprofiled median / profiled mean own time of every phase the profiled iterations ran for
    at least ``MIN_PHASE_NS`` (``TimeScale.profiled_ns`` says why a mean); empty without
    per-phase times or a clean unprofiled iteration."""
    unprofiled = phase_unprofiled_ns(phase_ns, warmup)
    profiled = phase_ns[warmup:]
    factors = {}
    for kind, unprofiled_ns in unprofiled.items():
        profiled_ns = statistics.fmean(p.get(kind, 0) for p in profiled)
        if profiled_ns >= MIN_PHASE_NS:
            factors[kind] = unprofiled_ns / profiled_ns
    return factors


def phase_unprofiled_ns(phase_ns: Sequence[Mapping[str, int]], warmup: int) -> dict[str, float]:
    """Median own time over the clean unprofiled iterations of every phase the profiled ones
    ran (and the unprofiled ones too); empty without per-phase times or a clean iteration."""
    clean, profiled = clean_unprofiled(phase_ns, warmup), phase_ns[warmup:]
    if not clean or not profiled:
        return {}
    medians = {
        kind: float(statistics.median(p.get(kind, 0) for p in clean))
        for kind in sorted({k for p in profiled for k in p})
    }
    return {kind: ns for kind, ns in medians.items() if ns > 0}


def time_scale(
    result: RankResult, warmup: int, *, by_phase: bool = True, launches: bool = False
) -> TimeScale | None:
    """The rank's unprofiled/profiled ratios (by phase when ``by_phase`` and the capture timed
    its phases), or None without a clean unprofiled iteration. Over the program's own time: a
    paced capture's held time is not the program's."""
    own_ns = result.own_iteration_ns
    clean, profiled = clean_unprofiled(own_ns, warmup), own_ns[warmup:]
    if not clean or not profiled:
        return None
    return TimeScale(
        rank=result.rank,
        unprofiled_ns=float(statistics.median(clean)),
        profiled_ns=float(statistics.fmean(profiled)),
        clean_iterations=len(clean),
        phase_factors=phase_factors(result.phase_ns, warmup) if by_phase else {},
        phase_unprofiled_ns=phase_unprofiled_ns(result.phase_ns, warmup) if by_phase else {},
        launches=launches,
    )


def calls_are_launches(device: str) -> bool:
    """Whether a process-group call's captured host time is its launch, host work that stays in
    the graph (CUDA: the device runs the collective), rather than the collective the comm model
    prices (CPU: gloo runs it on the host)."""
    return device == "cuda"


def correction_scale(
    result: RankResult, warmup: int, correction: Correction, device: str
) -> TimeScale | None:
    """The time scale a build applies to a captured rank under ``correction``: None for NONE (or
    without a clean unprofiled iteration); by phase only with PHASE on CPU, where the phase spans
    are the work's own time (on CUDA they are host time, ahead of the device)."""
    if correction == Correction.NONE:
        return None
    return time_scale(
        result,
        warmup,
        by_phase=correction == Correction.PHASE and device == "cpu",
        launches=calls_are_launches(device),
    )


def host_kept(units: pd.DataFrame, *, launches: bool) -> np.ndarray:
    """Which of ``units`` (an op table's columns) are calls whose captured time is host work the
    comm model does not price, to stay in the rank's time (``scaled_times``): with ``launches``
    (CUDA) every call, and on any device a call made asynchronously (one that returned a Work:
    the post)."""
    is_comm = units[ot.IS_COMM].fillna(False).to_numpy(dtype=bool)
    if launches:
        return is_comm
    is_async = units[ot.IS_ASYNC].fillna(False).to_numpy(dtype=bool)
    return is_comm & is_async


def own_ns(units: pd.DataFrame) -> float:
    """The own time ``units`` (an op table's columns) hold: every gap, and the durations of all
    but the calls (the comm model prices those)."""
    compute = ~units[ot.IS_COMM].fillna(False).to_numpy(dtype=bool)
    return float(units[ot.GAP_NS].sum() + units[ot.DUR_NS].to_numpy()[compute].sum())


class ScaledTimes(NamedTuple):
    """Units' times with the profiler's cost taken out."""

    dur_ns: np.ndarray
    gap_ns: np.ndarray
    post_ns: np.ndarray
    """Host time to run after each call (``ot.POST_NS``)."""


def scaled_times(
    dur_ns: np.ndarray, gap_ns: np.ndarray, is_comm: np.ndarray, factor: np.ndarray, *, kept: np.ndarray,
    launches: bool,
) -> ScaledTimes:  # fmt: skip
    """Units' durations and gaps with the profiler's cost taken out: compute and gaps times their
    ``factor``; a call's duration as captured (the comm model prices it), and where ``kept``
    (``host_kept``) its host part, times its factor: with ``launches`` added to its gap (a
    launch precedes what it launches), else run after the call (a post)."""
    dur = dur_ns.astype(np.float64)
    host = np.where(is_comm & kept, dur * factor, 0.0)
    gap = gap_ns.astype(np.float64) * factor + (host if launches else 0.0)
    dur = np.where(is_comm, dur, dur * factor)
    post = np.zeros_like(host) if launches else host
    return ScaledTimes(*(np.round(a).astype(np.int64) for a in (dur, gap, post)))


def _scaled(segment: Segment, scale: TimeScale | None, launches: bool) -> Segment:
    # A segment is a step's block with the glue before it, which the phase times count as the
    # block's (``own_phase_ns``): one factor for all of it. Before the first step and after the
    # last, glue's.
    units = segment.units.copy()
    kind = None if segment.kind in (PRE, POST) else segment.kind
    factor = np.full(len(units), 1.0 if scale is None else scale.factor_of(kind))
    units[ot.DUR_NS], units[ot.GAP_NS], units[ot.POST_NS] = scaled_times(
        units[ot.DUR_NS].to_numpy(),
        units[ot.GAP_NS].to_numpy(),
        units[ot.IS_COMM].fillna(False).to_numpy(dtype=bool),
        factor,
        kept=host_kept(units, launches=launches),
        launches=launches,
    )
    return replace(segment, units=units)


def scale_template(template: RoleTemplate, scale: TimeScale | None, *, launches: bool) -> RoleTemplate:
    """``template`` with every compute duration and every gap multiplied by its phase's factor
    (none without a ``scale``), and the host part of the calls ``host_kept`` names kept: with
    ``launches`` each call's launch in its gap, else each post after its call (``ot.POST_NS``)."""
    segments = {kind: _scaled(segment, scale, launches) for kind, segment in template.segments.items()}
    return replace(template, segments=segments)
