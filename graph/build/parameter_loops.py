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


def per_parameter_glue(
    units: pd.DataFrame,
    glue: np.ndarray,
    sources: Sequence[int],
    count: int,
    traced: LoopFrees | None = None,
) -> pd.DataFrame:
    """Units outside the passes that run once for each parameter in turn (``count`` captured
    parameters), one for each target parameter (the unit of the captured parameter ``sources``
    names), where the first of them ran: the units of one name in stretches of two or more
    between two passes, exactly as many as the captured parameters."""
    if count < 2:  # a stretch of one unit is no evidence of a loop over parameters
        return units
    names = units[ot.NAME].to_numpy()
    edges = np.flatnonzero(np.diff(np.r_[0, glue.astype(np.int8), 0]))
    picks = np.asarray(sources, dtype=np.int64)
    replaced: dict[int, np.ndarray] = {}  # first position of a per-parameter name: its captured units
    dropped = np.zeros(len(units), bool)
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        segment = names[start:stop]
        for name in dict.fromkeys(segment):
            at = start + np.flatnonzero(segment == name)
            runs = np.split(at, np.flatnonzero(np.diff(at) > 1) + 1)
            if len(at) == count and all(len(run) >= 2 for run in runs):
                replaced[int(at[0])] = at
                dropped[at] = True
    if not replaced:
        return units
    pieces, loops, size = [], [], 0
    for i in range(len(units)):
        if i in replaced:
            loops.append((replaced[i], size + np.arange(len(picks))))
            pieces.append(replaced[i][picks])
        elif not dropped[i]:
            pieces.append([i])
        else:
            continue
        size += len(pieces[-1])
    out = units.iloc[np.concatenate(pieces)].reset_index(drop=True)
    for at, placed in loops:
        _loop_memory(out, placed[:, None], units, at[:, None], sources, traced, alike=True)
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
