"""A program's pipeline stage at another pipeline depth than the one captured: its warm-up.

Under 1F1B (torch.distributed.pipelining's ``Schedule1F1B``, Megatron's non-interleaved schedule)
stage ``s`` of ``pp`` with ``M`` microbatches runs ``W = min(pp - s - 1, M - 1)`` warm-up forward
steps, the forward the first backward pairs with, ``M - W - 1`` backward-forward pairs, and ``W``
cool-down backward steps before the last: its steps' phases read
``F^(W+1) (B F)^(M-W-1) B^(W+1)`` (a step: a pass and the transfers after it,
``prism.graph.build.microbatch_steps``). At another depth or place a stage runs the same steps
with another ``W``: warm-up steps, pairs and cool-down steps are dropped from their ends, or the
last of each copied, each of those that hold what most of its kind hold (the first backward,
which allocates the gradients, and a step that frees a buffer another one allocated stay as
captured), so that it still runs ``M`` microbatches; an iteration that would then hold more or
less than captured is refused. GPipe's stages (every forward, then every backward) run the same
steps at any depth. Each step keeps its captured units, calls and memory; a microbatch's
activations, allocated by its forward and freed by its backward, are then held as long as the
target's warm-up holds them, and each call is waited for as many units after it as captured.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.layer_passes import ORIGIN
from prism.graph.build.microbatch_steps import BACKWARD, FORWARD, Steps, microbatch_steps
from prism.graph.build.templates import TemplateError

ONE_F_ONE_B, GPIPE = "1F1B", "GPipe"


def warmup_forwards(steps: Steps) -> int:
    """``W`` of a stage's steps, or a TemplateError where they are not 1F1B's (or GPipe's) shape."""
    if steps.roots != 1:
        raise TemplateError(
            "the rank runs several pipeline stages (an interleaved or V-shaped schedule): its graph keeps the "
            "captured pp; capture at the target pp"
        )
    phases, m = steps.phases, steps.microbatches
    w = phases.index(BACKWARD) - 1 if BACKWARD in phases else -1
    if w < 0 or phases != _phases(w, m):
        raise TemplateError(
            "the stage's microbatch steps are neither 1F1B's nor GPipe's (warm-up forwards, backward-forward pairs, "
            "cool-down backwards): its graph keeps the captured pp; capture at the target pp"
        )
    return w


def _phases(w: int, m: int) -> tuple[str, ...]:
    return (FORWARD,) * (w + 1) + (BACKWARD, FORWARD) * (m - w - 1) + (BACKWARD,) * (w + 1)


def schedule_kind(warmups: dict[int, int], pp: int, microbatches: int) -> str:
    """1F1B or GPipe, from the warm-up forwards of each captured stage (``warmups``: stage to
    ``W``) at ``pp`` stages: a TemplateError where neither explains them all."""
    if all(w == min(pp - s - 1, microbatches - 1) for s, w in warmups.items()):
        return ONE_F_ONE_B
    if all(w == microbatches - 1 for w in warmups.values()):
        return GPIPE
    read = ", ".join(f"stage {s}: {w}" for s, w in sorted(warmups.items()))
    raise TemplateError(
        f"the captured stages run {read} forward steps before their first backward's pair: neither 1F1B "
        f"(pp - stage - 1) nor GPipe (every forward first); its graph keeps the captured pp"
    )


def target_warmup(kind: str, *, stage: int, pp: int, microbatches: int) -> int:
    """``W`` of ``stage`` of ``pp`` under ``kind`` with ``microbatches``."""
    return microbatches - 1 if kind == GPIPE else min(pp - stage - 1, microbatches - 1)


@dataclass(frozen=True)
class _Parts:
    """A stage's steps (their indices) by role in the schedule."""

    warm: list[int]
    """The ``W`` warm-up forwards."""
    turn: int
    """The forward the first backward pairs with."""
    pairs: list[tuple[int, int]]
    """The (backward, forward) pairs of the steady state."""
    cool: list[int]
    """The ``W`` cool-down backwards."""
    last: int
    """The last backward."""


def _parts(steps: Steps, w: int) -> _Parts:
    """The roles of the steps of a stage with ``w`` warm-up forwards."""
    n = len(steps.phases)
    pairs = [(i, i + 1) for i in range(w + 1, n - w - 1, 2)]
    return _Parts(warm=list(range(w)), turn=w, pairs=pairs, cool=list(range(n - w - 1, n - 1)), last=n - 1)


def _resized(items: list, count: int, held: dict, *, what: str) -> list:
    """``items`` (steps, or pairs of steps) at ``count``: those that hold what most of them hold
    (``held``: each item's allocations less its frees) dropped from the end, or the last of them
    copied. An item apart from the others (the first backward, which allocates the gradients;
    one that frees a buffer another step allocated) is kept as captured."""
    if count == len(items):
        return items
    if not items:
        raise TemplateError(
            f"the captured stage runs no {what} to copy for the target's: capture at the target pp, or with more "
            "pipeline stages"
        )
    counts = Counter(held[i] for i in items)
    # The most common; of equals, the later (a first item is the one apart where two are captured).
    usual = max(reversed(items), key=lambda i: counts[held[i]])
    usual = held[usual]
    alike = [i for i in items if held[i] == usual]
    if count > len(items):
        return items + [alike[-1]] * (count - len(items))
    dropped = (alike[::-1] + [i for i in items[::-1] if held[i] != usual])[: len(items) - count]
    return [i for i in items if i not in dropped]


def change_warmup(
    units: pd.DataFrame, waits: dict[int, list[int]], warmup: int
) -> tuple[pd.DataFrame, dict[int, list[int]]]:
    """A stage program's units (one iteration, positions 0..n-1) and their waits with ``warmup``
    forward steps before its first backward's pair, the same microbatches; ``ORIGIN`` gives the
    position each unit copies."""
    units = units.reset_index(drop=True)
    steps = microbatch_steps(units)
    w = warmup_forwards(steps)
    if warmup == w:
        return units, waits
    m = steps.microbatches
    if not 0 <= warmup < m:
        raise TemplateError(
            f"a 1F1B stage of {m} microbatches runs 0 to {m - 1} warm-up forwards, not {warmup}: give more "
            "microbatches (--microbatches) for this pipeline depth"
        )
    parts, bounds = _parts(steps, w), steps.bounds
    net = (units[ot.ALLOC_BYTES] - units[ot.FREE_BYTES]).to_numpy(dtype=np.int64)
    held = {i: int(net[slice(*bounds[i])].sum()) for i in range(len(bounds))}
    held |= {pair: held[pair[0]] + held[pair[1]] for pair in parts.pairs}
    warm = _resized(parts.warm, warmup, held, what="warm-up forward step")
    pairs = _resized(parts.pairs, m - warmup - 1, held, what="backward-forward pair")
    cool = _resized(parts.cool, warmup, held, what="cool-down backward step")
    order = [*warm, parts.turn, *(i for pair in pairs for i in pair), *cool, parts.last]
    moved = sum(held[i] for i in order) - sum(held[i] for i in range(len(bounds)))
    if moved:
        raise TemplateError(
            f"the stage's steps at {warmup} warm-up forwards hold {moved:+,} bytes more in an iteration than captured: "
            "a step frees what another allocated in a way its copies do not repeat; capture at the target pp"
        )
    pieces = [np.arange(0, bounds[0][0])]
    pieces += [np.arange(*bounds[i]) for i in order]
    pieces.append(np.arange(bounds[-1][1], len(units)))
    origin = np.concatenate(pieces)
    out = units.iloc[origin].reset_index(drop=True)
    out[ORIGIN] = origin
    return out, _moved_waits(origin, waits)


def _moved_waits(origin: np.ndarray, waits: dict[int, list[int]]) -> dict[int, list[int]]:
    """``waits`` at the moved positions: each call waited for as many units after it as captured
    (in its own step, the same unit; in a later one, the unit there of the step the target runs
    in its place), or at the iteration's end."""
    waited_at = {call: at for at, calls in waits.items() for call in calls}
    out: dict[int, list[int]] = {}
    for i in np.flatnonzero(np.isin(origin, list(waited_at))):
        at = min(int(i) + waited_at[int(origin[i])] - int(origin[i]), len(origin) - 1)
        out.setdefault(at, []).append(int(i))
    return out
