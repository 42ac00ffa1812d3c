"""Units a stage runs once for each parameter, at another layer count's parameters.

Outside the forward and backward passes some units run once per parameter in turn: a pipeline
schedule scaling each gradient by its microbatches, a gradient clip's per-parameter ops, DDP's
copies out of its buckets, and a for-loop optimizer step's group of ops. At another layer count
each target parameter runs the units of the captured parameter it copies.

Their frees are traced by address where the capture's memory events are at hand (``LoopFrees``):
what a group frees of its own allocations goes with its copy; what it frees of the group
before it (a for-loop optimizer's temporaries, dropped when the next parameter's replace them)
is what the target's predecessor left. In a loop of one unit a parameter, what a unit frees
beyond its alike units and beyond anything they allocate (a pipeline schedule's per-microbatch
state, dropped in the gap after the last parameter's unit, which the stage program gives to the
unit before it) belongs to the loop, not to a parameter: it is freed once, at the same place of
the target's loop (on its last unit if it was on the last).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.templates import TemplateError

LoopFrees = Callable[[pd.DataFrame, np.ndarray], np.ndarray]
"""For a loop's groups of units (rows: one group's positions in the units given, a parameter
each), what each unit frees of the group before it's blocks."""


def _loop_memory(
    out: pd.DataFrame,
    placed: np.ndarray,
    units: pd.DataFrame,
    groups: np.ndarray,
    sources: Sequence[int],
    traced: LoopFrees | None,
    *,
    alike: bool,
) -> None:
    """The frees of the target loop's units in ``out`` (``placed``: the target groups' output
    positions, each a copy of captured group ``sources[t]`` of ``units``' ``groups``). With
    ``alike`` (one unit a parameter), what a unit frees beyond the loop's median and beyond
    anything a unit of the loop allocates, its lag apart, is the loop's: freed once, at the same
    place of the target loop."""
    free = units[ot.FREE_BYTES].to_numpy(dtype=np.int64)[groups]
    picks = np.asarray(sources, dtype=np.int64)
    before = np.zeros_like(free) if traced is None else np.minimum(traced(units, groups), free)
    own = free - before
    loops = np.zeros_like(free)
    if alike:  # beyond the median and beyond any unit's allocation: no parameter's temporary
        beyond = own - np.median(own, axis=0).astype(np.int64)
        alloc = units[ot.ALLOC_BYTES].to_numpy(dtype=np.int64)[groups]
        loops = np.where(beyond > alloc.max(), beyond, 0)
        own = own - loops
    target = own[picks].copy()
    # What a target group frees of its predecessor's: what the captured group after the
    # predecessor's source freed of it.
    after = np.minimum(picks[:-1] + 1, len(groups) - 1)
    target[1:] += before[after]
    target[0] += before[picks[0]]
    for j in np.flatnonzero(loops.any(axis=1)):
        target[round(j * (len(picks) - 1) / max(len(groups) - 1, 1))] += loops[j]
    column = out[ot.FREE_BYTES].to_numpy(dtype=np.int64).copy()
    column[placed] = target
    out[ot.FREE_BYTES] = column


LEADING_INPUTS = 4
"""Units of a loop's name that may run before it, one for each input of the stage: a split
backward (``torch.distributed.pipelining``'s ``stage_backward_input``) takes each leaf input's
gradient node as it then takes each parameter's."""


def _set_size(sets: list[tuple[int | None, int, np.ndarray]], key: int | None) -> int:
    return next(size for k, size, _ in sets if k == key)


def _parameter_sets(
    sources: Sequence[int], count: int, stages: Sequence[int]
) -> list[tuple[int | None, int, np.ndarray]]:
    """The sets of captured parameters a loop may run over: all ``count`` (stage None) and, where
    the rank holds several stages, each stage's (``stages``: each captured parameter's). Each
    with its size and the member of the set (its position in it) each target parameter of the
    set copies."""
    picks = np.asarray(sources, dtype=np.int64)
    sets: list[tuple[int | None, int, np.ndarray]] = [(None, count, picks)]
    of = np.asarray(stages, dtype=np.int64)
    for stage in dict.fromkeys(stages):
        members = np.flatnonzero(of == stage)
        mine = picks[of[picks] == stage]
        sets.append((int(stage), len(members), np.searchsorted(members, mine)))
    return sets


def per_parameter_glue(
    units: pd.DataFrame,
    glue: np.ndarray,
    sources: Sequence[int],
    count: int,
    traced: LoopFrees | None = None,
    stages: Sequence[int] = (),
) -> pd.DataFrame:
    """Units outside the passes that run once for each parameter in turn (``count`` captured
    parameters), one for each target parameter (the unit of the captured parameter ``sources``
    names), where the first of them ran: the units of one name in stretches of two or more
    between two passes, exactly as many as the captured parameters. Where the rank holds several
    stages (``stages``: each captured parameter's, as its units' marks name them), a loop may run
    over one stage's parameters (a pipeline schedule scaling each stage's gradients in turn): as
    many units as that stage's, the stage whose pass ran last where two stages have as many. A
    stretch of one name a few units longer than a set (``LEADING_INPUTS``) is that set's loop
    after a unit for each of the stage's inputs, which stay as captured."""
    sets = _parameter_sets(sources, count, stages)
    names = units[ot.NAME].to_numpy()
    stage = units[ot.STAGE].to_numpy() if ot.STAGE in units else np.full(len(units), -1)
    edges = np.flatnonzero(np.diff(np.r_[0, glue.astype(np.int8), 0]))
    replaced: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # first position of a loop: its units, picks
    dropped = np.zeros(len(units), bool)
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        segment = names[start:stop]
        ran = stage[:start][stage[:start] >= 0]
        last = int(ran[-1]) if len(ran) else None
        for name in dict.fromkeys(segment):
            at = start + np.flatnonzero(segment == name)
            runs = np.split(at, np.flatnonzero(np.diff(at) > 1) + 1)
            if len(at) < 2 or any(len(run) < 2 for run in runs):  # one unit is no evidence of a loop
                continue
            fits = [(key, picks) for key, size, picks in sets if size == len(at)]
            if not fits:  # a loop after a unit for each stage input (a split backward's gradient nodes)
                fits = [(key, picks) for key, size, picks in sets if 0 < len(at) - size <= LEADING_INPUTS]
                fits = [(key, picks) for key, picks in fits if len(runs) == 1]
            if len(fits) > 1:
                fits = [(key, picks) for key, picks in fits if key is None or key == last]
                if len(fits) != 1:  # as many units as two stages' parameters, neither's pass before it
                    raise TemplateError(
                        f"{len(at)} {name} units run once a parameter of one of the rank's stages, but of which is not "
                        "known (several hold as many): capture at the target layer count"
                    )
            if fits:
                loop = at[len(at) - _set_size(sets, fits[0][0]) :]
                replaced[int(loop[0])] = (loop, fits[0][1])
                dropped[loop] = True
    if not replaced:
        return units
    pieces, loops, size = [], [], 0
    for i in range(len(units)):
        if i in replaced:
            at, picks = replaced[i]
            loops.append((at, size + np.arange(len(picks)), picks))
            pieces.append(at[picks])
        elif not dropped[i]:
            pieces.append([i])
        else:
            continue
        size += len(pieces[-1])
    out = units.iloc[np.concatenate(pieces)].reset_index(drop=True)
    for at, placed, picks in loops:
        _loop_memory(out, placed[:, None], units, at[:, None], picks, traced, alike=True)
    return out


def optimizer_step(
    units: pd.DataFrame,
    in_step: np.ndarray,
    sources: Sequence[int],
    elements: Sequence[int],
    traced: LoopFrees | None = None,
) -> pd.DataFrame:
    """The optimizer step's units for the target's parameters (``sources``: the captured
    parameter each copies; ``elements``: each captured parameter's). A step that runs the same
    units for each parameter in turn (torch's for-loop implementations, as on CPU) runs one group
    a target parameter, each the group of the captured parameter it copies; a step of a few
    kernels over all of them (foreach, fused) takes time and memory in proportion to the
    parameter elements."""
    at = np.flatnonzero(in_step)
    count = len(elements)
    if not len(at):
        return units
    if len(at) % count == 0 and (np.diff(at) == 1).all():
        size = len(at) // count
        names = units[ot.NAME].to_numpy()[at].reshape(count, size)
        if (names == names[0]).all():
            groups = at.reshape(count, size)
            order = np.concatenate(
                [np.arange(at[0]), *groups[list(sources)], np.arange(at[-1] + 1, len(units))]
            )
            out = units.iloc[order].reset_index(drop=True)
            placed = at[0] + np.arange(len(sources) * size).reshape(len(sources), size)
            _loop_memory(out, placed, units, groups, sources, traced, alike=False)
            return out
    captured = sum(elements)
    ratio = sum(elements[i] for i in sources) / max(1, captured)
    for column in (ot.DUR_NS, ot.GAP_NS, ot.ALLOC_BYTES, ot.FREE_BYTES):
        values = units[column].to_numpy(dtype=np.float64)
        units[column] = np.where(in_step, np.round(values * ratio), values).astype(np.int64)
    return units
