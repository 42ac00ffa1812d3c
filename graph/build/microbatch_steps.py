"""A program's iteration at another microbatch count than the one captured, from its passes.

A pipeline schedule (or gradient accumulation) runs a forward and a backward **pass** per
microbatch: a stretch of units the capture marked forward or backward
(``prism.capture.program_phases``); a microbatch's backward may be several runs of the engine
(a loss computed and backpropagated in chunks before the stage's backward, on the stage that
computes it; a zero-bubble schedule's weight gradients after it). A **step** is one pass and
the units after it up to the next pass (the transfers it posts, the loss, the receive the next
pass waits for); the units before the first pass and after the last one's are the iteration's
own, kept as captured.

A schedule repeats one of two periods while the microbatches grow: forward and backward steps
in turn (1F1B's steady state, gradient accumulation: a pair a microbatch; an interleaved
schedule, several stages a rank, each forward naming its stage: a round of pairs, its stages'
passes in turn, as many microbatches as the round holds), or, where no such pairs repeat, a
stretch of forward steps and one of backward steps (GPipe). The **steady** period is the
stretch of at least ``MIN_STEADY`` alike ones (same units, stages, calls, peers, payloads and
memory) that covers the most steps; the iteration for ``M`` microbatches keeps every step as
captured and repeats (or drops) steady periods until it runs ``M`` microbatches' passes. A stage
with too few alike periods (1F1B needs ``pp + 2`` microbatches or more for two) has none to
repeat: the capture needs more microbatches.

What a period keeps past its steps (the last stage's outputs, kept for the loss) is freed by the
iteration's own units: they free it for every microbatch, traced by address as the capture
recorded them. The iteration's own units run as captured, whatever the microbatches: a batch
drawn or loaded whole before the first step, units run once a sample or a microbatch outside the
steps (a data loader's), the outputs merged after the last; the note bounds how far what is
allocated before the first step could move the peak.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.layer_passes import (
    MIN_STEADY,
    ORIGIN,
    RUN_SIGNATURE,
    frees_by_position,
    mapped_waits,
    pass_runs,
    through_layers,
    unit_signatures,
    weight_runs,
)
from prism.graph.build.templates import TemplateError
from prism.schemas.annotations import Phase

FORWARD, BACKWARD = str(Phase.FORWARD), str(Phase.BACKWARD)
STEP_SIGNATURE = (*RUN_SIGNATURE, ot.PEER)
"""What two steps must share, unit by unit, to stand for each other."""


@dataclass(frozen=True)
class Steps:
    """One iteration's microbatch steps: [start, stop) unit positions and pass phase, in order."""

    bounds: tuple[tuple[int, int], ...]
    phases: tuple[str, ...]
    roots: int = 1
    """Modules the rank's forward passes run (an interleaved schedule's stages on one rank): a
    microbatch runs a forward pass through each."""

    @property
    def microbatches(self) -> int:
        return self.phases.count(FORWARD) // self.roots


@dataclass(frozen=True)
class Period:
    """A stretch of alike periods of steps (``Repeating``): each run the units of one period."""

    runs: tuple[tuple[int, int], ...]
    microbatches: int = 1
    """Microbatches a period runs (an interleaved schedule's round: as many as its stages)."""

    @property
    def steady(self) -> tuple[int, int]:
        """Every run of the stretch is steady: it was found as alike ones."""
        return 0, len(self.runs)


@dataclass(frozen=True)
class Schedule:
    """How an iteration's steps repeat with the microbatches."""

    steps: Steps
    periods: tuple[Period, ...]
    """One stretch of forward-backward pairs, or a stretch of forward steps and one of backward
    steps."""

    before_bytes: int = 0
    """What the units before the first step allocate."""
    before_largest: str = ""
    """The name of the unit that allocates the most of it."""
    after_bytes: int = 0
    """What the units after the last step allocate outside the optimizer's step."""
    after_largest: str = ""
    """The name of the unit that allocates the most of it."""

    @property
    def paired(self) -> bool:
        return len(self.periods) == 1

    @property
    def microbatches_a_period(self) -> int:
        """Microbatches one period of each stretch runs: the counts a build can reach differ from
        the captured one by multiples of it."""
        return self.periods[0].microbatches

    @property
    def repeats(self) -> str:
        if not self.paired:
            return "a stretch of forward and one of backward steps"
        each = self.microbatches_a_period
        return (
            "forward-backward pairs"
            if each == 1
            else f"rounds of {each} microbatches' forward-backward pairs"
        )


def microbatch_steps(units: pd.DataFrame) -> Steps:
    """The steps of one iteration's units (positions 0..n-1). Raises TemplateError where the
    passes are not a forward and a backward per microbatch."""
    phase = units[ot.PHASE].astype(str).to_numpy()
    passes, begins, ends = pass_runs(units)
    if not passes:
        raise TemplateError("the capture marks no forward or backward pass: cannot change its microbatches")
    roots = len(np.unique(units[ot.STAGE].to_numpy()[phase == FORWARD])) if ot.STAGE in units else 1
    forwards, backwards = passes.count(FORWARD), passes.count(BACKWARD)
    kept = _backward_steps(units, passes, begins, ends)
    if not forwards or [passes[i] for i in kept].count(BACKWARD) != forwards or forwards % max(roots, 1):
        raise TemplateError(
            f"the iteration runs {forwards} forward and {backwards} backward passes: a forward pass and a backward "
            "(one run of the engine, or runs through no layer before or after the one through the stage's layers) "
            "a microbatch are needed to change the microbatches"
        )
    starts = begins[kept]
    stops = np.r_[starts[1:], ends[-1]]
    phases = tuple(passes[i] for i in kept)
    bounds = tuple((int(a), int(b)) for a, b in zip(starts, stops, strict=True))
    return Steps(bounds=bounds, phases=phases, roots=max(roots, 1))


def _backward_steps(
    units: pd.DataFrame, passes: list[str], begins: np.ndarray, ends: np.ndarray
) -> list[int]:
    """The passes that begin a step. A microbatch's backward may be several runs of the engine,
    whatever calls come between (a receive posted for the next step): a run through no layer
    block right after a forward pass begins the step the run through the layers after it joins (a
    loss computed and backpropagated in chunks), one right after a backward run joins that run's
    step (a zero-bubble schedule's weight gradients, computed after the inputs'). Where no
    backward run touches a layer block (a program whose blocks are not marked), runs in a row, as
    many each microbatch, are one step."""
    # A weight run names its parameters' layer, yet joins a step as a run through none would.
    touches = through_layers(units, begins, ends) & ~weight_runs(units, begins)
    backward = {i for i, p in enumerate(passes) if p == BACKWARD}
    if any(touches[i] for i in backward):
        starts, leading = [], False  # leading: a step of runs through no layer, its layers' run to come
        for i in range(len(passes)):
            after_backward = i - 1 in backward
            if i not in backward or not (after_backward and (leading or not touches[i])):
                starts.append(i)
                leading = i in backward and not touches[i]
            elif touches[i]:
                leading = False
        return starts
    runs = len(backward) // max(passes.count(FORWARD), 1)
    kept, at = [], 0
    while at < len(passes):
        kept.append(at)
        if passes[at] == BACKWARD and runs > 1:
            if passes[at : at + runs] != [BACKWARD] * runs:
                return list(range(len(passes)))  # not in runs of ``runs``: as many steps as passes
            at += runs
        else:
            at += 1
    return kept


def _longest_alike(signatures: list[tuple], members: list[int], step: int) -> list[int]:
    """The longest stretch of ``members`` (step positions, ``step`` apart where they follow each
    other) with alike signatures, at least ``MIN_STEADY`` of them (the earliest of equals), or []."""
    best: list[int] = []
    first = 0
    for i in range(1, len(members) + 1):
        if (
            i == len(members)
            or members[i] - members[i - 1] != step
            or signatures[members[i]] != signatures[members[first]]
        ):
            if i - first >= MIN_STEADY and i - first > len(best):
                best = members[first:i]
            first = i
    return best


def _paired_periods(of_step: list[tuple], phases: tuple[str, ...]) -> tuple[list[int], int]:
    """The stretch of alike periods of forward-backward pairs (their first steps) that covers
    the most steps, and the pairs a period holds (the fewest of equals): one (1F1B's steady
    state, gradient accumulation), or a round (an interleaved schedule's stages' passes in turn,
    where single pairs repeat only within a round); ([], 0) if none."""
    n = len(of_step)
    best: tuple[list[int], int] = ([], 0)
    for pairs in range(1, n // (2 * MIN_STEADY) + 1):
        size = 2 * pairs
        blocks = [tuple(of_step[j : j + size]) for j in range(n - size + 1)]
        for offset in range(size):
            starts = [
                j
                for j in range(offset, n - size + 1, size)
                if all(phases[k] != phases[k + 1] for k in range(j, j + size, 2))
            ]
            stretch = _longest_alike(blocks, starts, size)
            if len(stretch) * pairs > len(best[0]) * best[1]:
                best = (stretch, pairs)
    return best


def _round(units: pd.DataFrame, run: tuple[int, int], steps: Steps) -> int:
    """Microbatches a period of forward-backward pairs (``run``) holds: its forward passes, as
    many through each of the rank's stages. Raises TemplateError where they are not (a period
    that is no whole round: its count cannot grow by it)."""
    phase = units[ot.PHASE].astype(str).to_numpy()[run[0] : run[1]]
    begins = [a - run[0] for a, _ in steps.bounds if run[0] <= a < run[1]]
    forwards = [a for a in begins if phase[a] == FORWARD]
    if steps.roots == 1:
        return len(forwards)
    stage = units[ot.STAGE].to_numpy()[run[0] : run[1]]
    through = Counter(int(stage[a]) for a in forwards)
    if len(through) != steps.roots or len(set(through.values())) != 1:
        raise TemplateError(
            f"the rank's forward passes run {steps.roots} modules and its repeating period runs them "
            f"{dict(sorted(through.items()))} times: no whole round; capture at the target microbatch count"
        )
    return len(forwards) // steps.roots


def schedule_of(units: pd.DataFrame) -> Schedule:
    """The steps of ``units`` and the periods that repeat with the microbatches."""
    steps = microbatch_steps(units)
    before_bytes, before_largest = _outside_allocation(units, 0, steps.bounds[0][0])
    after_bytes, after_largest = _outside_allocation(units, steps.bounds[-1][1], len(units))
    outside = {
        "before_bytes": before_bytes, "before_largest": before_largest,
        "after_bytes": after_bytes, "after_largest": after_largest,
    }  # fmt: skip
    columns = (*STEP_SIGNATURE, ot.STAGE) if ot.STAGE in units else STEP_SIGNATURE
    signature = unit_signatures(units, columns)
    of_step = [tuple(signature[a:b]) for a, b in steps.bounds]
    starts, pairs = _paired_periods(of_step, steps.phases)
    if starts:
        runs = tuple((steps.bounds[j][0], steps.bounds[j + 2 * pairs - 1][1]) for j in starts)
        return Schedule(
            steps=steps, periods=(Period(runs=runs, microbatches=_round(units, runs[0], steps)),), **outside
        )
    if steps.roots > 1:
        raise TemplateError(
            f"the rank's forward passes run {steps.roots} modules and no {MIN_STEADY} alike rounds of forward-backward "
            "pairs repeat: capture with more microbatches, or at the target count"
        )
    periods = []
    n = len(steps.bounds)
    for phase in (FORWARD, BACKWARD):
        members = [j for j in range(n) if steps.phases[j] == phase]
        stretch = _longest_alike(of_step, members, 1)
        if not stretch:
            raise TemplateError(
                f"the {steps.microbatches} captured microbatches run no {MIN_STEADY} alike forward-backward pairs "
                f"and no {MIN_STEADY} alike {phase} steps in a row: nothing repeats to change their count; capture "
                "with more microbatches (a 1F1B schedule needs pp + 2 or more)"
            )
        periods.append(Period(runs=tuple(steps.bounds[j] for j in stretch)))
    return Schedule(steps=steps, periods=tuple(periods), **outside)


def expand_microbatches(units: pd.DataFrame, schedule: Schedule, microbatches: int) -> pd.DataFrame:
    """``units`` (one iteration, positions 0..n-1) running ``microbatches`` forward and backward
    passes: each steady stretch with periods repeated after its first one, or dropped from its
    end; ``ORIGIN`` gives the captured position each unit copies."""
    more = periods_more(schedule, microbatches)
    fewest = min(len(p.runs) for p in schedule.periods)
    if more < 1 - fewest:
        each = schedule.microbatches_a_period
        raise TemplateError(
            f"--microbatches {microbatches}: the capture's {schedule.steps.microbatches} microbatches repeat "
            f"{fewest} alike periods and at least one stays, so at least "
            f"{schedule.steps.microbatches - (fewest - 1) * each}"
        )
    pieces, at = [], 0
    for period in sorted(schedule.periods, key=lambda p: p.runs[0][0]):
        start, stop = period.runs[0][0], period.runs[-1][1]
        pieces.append(np.arange(at, start))
        kept = len(period.runs) + min(more, 0)
        runs = [period.runs[0]] * (1 + max(more, 0)) + list(period.runs[1:kept])
        pieces.extend(np.arange(a, b) for a, b in runs)
        at = stop
    pieces.append(np.arange(at, len(units)))
    origin = np.concatenate(pieces)
    out = units.iloc[origin].reset_index(drop=True)
    out[ORIGIN] = origin
    return out


def periods_more(schedule: Schedule, microbatches: int) -> int:
    """Periods of each stretch the iteration at ``microbatches`` runs more than the captured one
    (fewer where negative). Raises TemplateError where the difference is no whole number of
    periods (an interleaved schedule grows by rounds)."""
    more, each = microbatches - schedule.steps.microbatches, schedule.microbatches_a_period
    if more % each:
        raise TemplateError(
            f"--microbatches {microbatches}: the schedule repeats rounds of {each} microbatches, so the count "
            f"differs from the captured {schedule.steps.microbatches} by a multiple of {each}"
        )
    return more // each


def outside_steps(size: int, steps: Steps) -> np.ndarray:
    """Of ``size`` units, those before the first step and after the last one."""
    outside = np.ones(size, bool)
    outside[steps.bounds[0][0] : steps.bounds[-1][1]] = False
    return outside


@dataclass(frozen=True)
class MicrobatchTarget:
    """A program's stage at another microbatch count than the one captured."""

    microbatches: int
    freed_of_rows: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    """Per row of the captured rank's op table (by ``SEQ``), what it frees of the blocks the
    rows given as a mask allocated, in its span and in its gap
    (``prism.graph.build.normalize.freed_of_rows``)."""
    memory_addresses: Callable[[], np.ndarray]
    """The addresses the captured rank's memory events name
    (``prism.graph.build.normalize.memory_addresses``)."""


@dataclass(frozen=True)
class MicrobatchChange:
    """What a stage built at another microbatch count reads and holds besides its nodes."""

    schedule: Schedule
    """How its captured steps repeat."""
    static_bytes: int
    """Bytes it holds across iterations beyond the captured rank: per period more, what one
    keeps into the next iteration and the receive buffers kept for it."""


def _period_copies(schedule: Schedule, captured: np.ndarray, positions: int) -> np.ndarray:
    """Per captured position of an iteration (``positions`` of them), how many units of one
    steady period of each repeated stretch copy it (``captured``: each unit's captured position,
    -1 for none): 1 each at the captured layer count; at another, a steady layer's units are
    copied for each layer the target has and the layers left out copied by none."""
    copies = np.zeros(positions, np.int64)
    for period in schedule.periods:
        a, b = period.runs[period.steady[0]]
        at = captured[a:b]
        copies += np.bincount(at[at >= 0], minlength=positions)
    return copies


def _period_frees(
    iterations: list[pd.DataFrame],
    traced: list[pd.DataFrame],
    copies: np.ndarray,
    target: MicrobatchTarget,
    rows: int,
) -> np.ndarray:
    """Per captured position of ``iterations``' steady ones, what it frees of the blocks one
    steady period allocates in ``traced`` (a block allocated where ``copies`` says n units copy
    it counted n times, as each copy allocates its own; ``frees_by_position``)."""
    out = np.zeros(len(iterations[0]), np.int64)
    for n in np.unique(copies[copies > 0]):
        mask = np.zeros(rows, bool)
        for iteration in traced:
            mask[iteration[ot.SEQ].to_numpy()[copies == n]] = True
        out += int(n) * frees_by_position(iterations, target.freed_of_rows(mask))
    return out


def _kept_frees(
    units: pd.DataFrame,
    schedule: Schedule,
    iterations: list[pd.DataFrame],
    target: MicrobatchTarget,
    rows: int,
    captured: np.ndarray,
) -> np.ndarray:
    """Per unit outside the steps: what it frees of one steady period's blocks
    (``prism.graph.build.layer_passes.frees_by_position`` at its captured position)."""
    copies = _period_copies(schedule, captured, len(iterations[0]))
    by_position = _period_frees(iterations, iterations, copies, target, rows)
    first, last = schedule.steps.bounds[0][0], schedule.steps.bounds[-1][1] - 1
    by_position[captured[first] : captured[last] + 1] = 0  # the captured steps' own
    return _placed(by_position, captured, outside_steps(len(units), schedule.steps))


def _carried_into_steps(
    schedule: Schedule,
    iterations: list[pd.DataFrame],
    target: MicrobatchTarget,
    rows: int,
    captured: np.ndarray,
) -> int:
    """What the next iteration's steps free of a steady period's blocks: a buffer a microbatch
    keeps until it runs again (a V-shaped schedule's inputs handed between a rank's own stages,
    replaced as the next iteration hands them again), held across iterations, one each period.
    Nothing where one iteration was traced."""
    if len(iterations) < 2:
        return 0
    copies = _period_copies(schedule, captured, len(iterations[0]))
    by_position = _period_frees(iterations[1:2], iterations[:1], copies, target, rows)
    first, last = schedule.steps.bounds[0][0], schedule.steps.bounds[-1][1] - 1
    return int(by_position[captured[first] : captured[last] + 1].sum())


def _placed(by_position: np.ndarray, captured: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """``by_position`` (per captured position) on the units ``outside`` the steps: each captured
    position's on its first copy, or, where it has none (a unit run once a parameter, fewer
    parameters at another layer count), on the unit before the first that copies a later one
    (where ``prism.graph.build.parameter_loops`` keeps a loop's own frees), so that each byte is
    freed once and where it was."""
    out = np.zeros(len(captured), np.int64)
    kept = np.flatnonzero(outside & (captured >= 0))
    if not len(kept):
        return out
    order = kept[np.argsort(captured[kept], kind="stable")]
    sources = captured[order]
    for position in np.flatnonzero(by_position):
        i = min(int(np.searchsorted(sources, position, side="left")), len(order) - 1)
        at = order[i]
        if sources[i] != position and at > 0 and outside[at - 1]:
            at -= 1
        out[at] += by_position[position]
    return out


def kept_per_period(units: pd.DataFrame, schedule: Schedule) -> int:
    """Bytes one more period (a microbatch, or a round's) keeps past its steps: what its steady
    periods allocate and do not free."""
    net = (units[ot.ALLOC_BYTES] - units[ot.FREE_BYTES]).to_numpy(dtype=np.int64)
    return int(sum(net[slice(*p.runs[p.steady[0]])].sum() for p in schedule.periods))


def _outside_allocation(units: pd.DataFrame, start: int, stop: int) -> tuple[int, str]:
    """What the units [start, stop) outside the steps allocate, the optimizer's step aside (the
    batch and what the iteration computes from it before its first microbatch; the outputs merged
    after the last), and the name of the unit that allocates the most: kept as captured whatever
    the microbatches."""
    outside = units.iloc[start:stop]
    alloc = np.where(
        outside[ot.PHASE].astype(str).to_numpy() == str(Phase.OPTIMIZER),
        0,
        outside[ot.ALLOC_BYTES].to_numpy(),
    ).astype(np.int64)
    if not alloc.any():
        return 0, ""
    return int(alloc.sum()), str(outside[ot.NAME].iloc[int(alloc.argmax())])


def microbatch_notes(schedules: dict[str, Schedule], microbatches: int) -> tuple[str, ...]:
    """What the user should know of the stages built at ``microbatches`` (keyed by program), or a
    TemplateError where the stages' schedules read differently (too few microbatches captured to
    tell 1F1B from GPipe on every stage)."""
    kinds = {key: s.repeats for key, s in schedules.items()}
    if len(set(kinds.values())) > 1:
        read = "; ".join(f"stage {key}: {kind}" for key, kind in kinds.items())
        raise TemplateError(
            f"the stages' schedules repeat differently ({read}): capture with more microbatches so that each "
            "stage shows its steady state"
        )
    notes = []
    for key, s in schedules.items():
        captured = s.steps.microbatches
        outside = [
            f"{n:,} bytes {where}, most in {largest}"
            for n, where, largest in (
                (s.before_bytes, "before its first microbatch", s.before_largest),
                (s.after_bytes, "after its last", s.after_largest),
            )
            if n
        ]
        if outside and microbatches != captured:
            moved = (s.before_bytes + s.after_bytes) * abs(microbatches - captured) // captured
            notes.append(
                f"stage {key}: what it allocates outside its microbatches is as captured ({'; '.join(outside)}; the "
                "optimizer's aside); where that is the whole batch's (a batch drawn whole, the outputs merged) it grows "
                f"with the microbatches, and the peak memory may be off by up to {moved:,} bytes"
            )
    return tuple(notes)


def persistent_receive_bytes(units: pd.DataFrame, schedule: Schedule, addresses: np.ndarray) -> int:
    """Bytes of the receive buffers a steady period keeps across iterations: those its receives
    write into that the profiler saw neither allocated nor freed (held throughout, as a pipeline
    stage keeps one per microbatch), each period its own. Raises TemplateError where periods
    share such a buffer in part, which one capture cannot scale."""
    buffer = units[ot.BUFFER].to_numpy(dtype=np.int64)
    receives = (units[ot.IS_COMM].to_numpy(dtype=bool)) & (units[ot.COMM_OP].astype(str) == "recv").to_numpy()
    kept = 0
    for period in schedule.periods:
        places = [np.flatnonzero(receives[a:b]) + a for a, b in period.runs]
        if len({len(p) for p in places}) != 1:
            continue  # alike periods make the same receives: nothing to compare otherwise
        for offset in range(len(places[0])):
            at = np.array([p[offset] for p in places])
            held = buffer[at][(buffer[at] != 0) & ~np.isin(buffer[at], addresses)]
            if not len(held):
                continue
            if len(held) != len(at) or len(np.unique(held)) not in (1, len(at)):
                raise TemplateError(
                    f"the steady microbatches receive {int(units[ot.BYTES].iloc[at[0]]):,} bytes into buffers held across "
                    "iterations, some shared and some not: how many another microbatch count keeps is not known; capture "
                    "at the target microbatch count"
                )
            if len(np.unique(held)) == len(at):  # one buffer a microbatch, not one for all
                kept += int(units[ot.BYTES].iloc[at[0]])
    return kept


def retarget_microbatches(
    units: pd.DataFrame,
    iterations: list[pd.DataFrame],
    waits: dict[int, list[int]],
    target: MicrobatchTarget,
    rows: int,
) -> tuple[pd.DataFrame, dict[int, list[int]], MicrobatchChange]:
    """A stage program's units (one iteration, timed) and their waits at ``target``'s microbatch
    count (``expand_microbatches``); the units outside the steps free what each microbatch keeps
    for every microbatch. ``units`` may be at another layer count already (their ``ORIGIN``, the
    captured positions, finds what they free). ``rows``: the captured rank's op table's length.
    Also what it holds across iterations beyond the captured rank."""
    units = units.reset_index(drop=True)
    # Units at another layer count (``prism.graph.build.layer_passes``) name the captured unit
    # each copies; calls planned for the target (DDP's buckets) copy none.
    captured = units[ORIGIN].fillna(-1).to_numpy(dtype=np.int64) if ORIGIN in units else np.arange(len(units))
    schedule = schedule_of(units)
    expanded = expand_microbatches(units, schedule, target.microbatches)
    frees = _kept_frees(units, schedule, iterations, target, rows, captured)
    kept = kept_per_period(units, schedule)
    if int(frees.sum()) != kept:
        raise TemplateError(
            f"a microbatch keeps {kept:,} bytes past its steps and the units outside them free {int(frees.sum()):,} "
            "of them: where the rest is freed is not known, so another microbatch count's memory would be wrong; "
            "capture at the target microbatch count"
        )
    more = periods_more(schedule, target.microbatches)
    origin = expanded[ORIGIN].to_numpy()
    expanded[ot.FREE_BYTES] = expanded[ot.FREE_BYTES].to_numpy() + more * frees[origin]
    if (expanded[ot.FREE_BYTES].to_numpy() < 0).any():
        raise TemplateError(
            f"the units that free what each microbatch keeps free less than "
            f"{-more * schedule.microbatches_a_period} fewer microbatches' worth at this layer count: where the rest "
            "is freed is not known; capture at the target microbatch count"
        )
    # Freed before the first step: kept from the iteration before, so held as the iteration begins.
    into_next = int(frees[: schedule.steps.bounds[0][0]].sum())
    carried = _carried_into_steps(schedule, iterations, target, rows, captured)
    held = into_next + carried + persistent_receive_bytes(units, schedule, target.memory_addresses())
    change = MicrobatchChange(schedule=schedule, static_bytes=more * held)
    return expanded, mapped_waits(expanded, waits, schedule.periods), change
