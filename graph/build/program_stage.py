"""The program of one pipeline stage of a user's program, from its captured rank's traces alone.

A program prism knows nothing about has no schedule to rebuild, so the stage program is what
its captured rank did in one profiled iteration, unit by unit, in program order (the op table of
``prism.graph.build.normalize``, each unit in the phase the capture marked around it:
``prism.capture.program_phases``): its compute, the gaps between, and its
process-group calls, each collective on the layout group its label names (``tp.3`` is the tp
group of whichever rank runs the program) and each send or recv with the same stage of the
running rank's own pipeline (the next, the previous, or the first from the last). Every profiled iteration must run the same units; each unit's duration and gap
are their means over the iterations, its memory (with what the Python between ops allocates and
frees, ``_memory``) the median over the profiled iterations after the first.

An asynchronous call completes at a wait node: where the program called ``wait()`` on its
Work in the capture, or blocked on it from C++ (the comm log's ``first_wait_ns``: a pipeline
schedule posts its receives early and waits for them later; DDP's reducer waits for its last
buckets as ``backward()`` ends). Calls whose waits the log does not see (complete before the
program came to them): one made during a
backward pass (DDP's bucket all-reduces, issued from autograd hooks: the unit before it is one
of ``BACKWARD_OPS``) is waited for where that backward pass ends, as DDP's reducer does before
``backward()`` returns; any other is waited for right after it is made (a functional
collective's result is used by the next op).

Each unit keeps the layer block it ran in (the capture's layer marks,
``prism.capture.program_layers``; -1 outside every block), so that what-ifs and replays can
delay a program's layers, and a stage can walk another layer count than the one captured
(``prism.graph.build.layer_passes``). Its forward and backward passes, a pair a microbatch,
let it run another microbatch count (``prism.graph.build.microbatch_steps``), and 1F1B's warm-up
of another place in a pipeline of another depth (``prism.graph.build.pipeline_depth``). Its
collectives' groups may take another size than captured where their calls' bytes do not depend
on it (``prism.graph.build.resized_groups``); tp, cp and ep stay as captured.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.bind import axis_size, kind_codes
from prism.graph.build.compose import (
    MB,
    OVERLAP,
    P2P_DIR,
    SKEW,
    StageProgram,
    finish_nodes,
    wait_node,
    waiting_columns,
)
from prism.graph.build.layer_passes import LayerTarget, retarget_units
from prism.graph.build.microbatch_steps import MicrobatchTarget, retarget_microbatches
from prism.graph.build.pipeline_depth import change_warmup
from prism.graph.build.profiler_overhead import TimeScale, host_kept, own_ns, scaled_times
from prism.graph.build.templates import GROUP_AXIS, TemplateError
from prism.schemas.annotations import GLUE, Part, block_kind
from prism.schemas.layout import ParallelLayout

BACKWARD_OPS = ("autograd::engine::evaluate_function", "torch::autograd::", "torch::distributed::reducer::")
"""Top-level units of a backward pass: the autograd engine's functions, gradient accumulation, and
DDP's reducer hooks that run between them."""

_KEY = (ot.NAME, ot.IS_COMM, ot.COMM_OP, ot.GROUP_LABEL, ot.BYTES, ot.PEER)


def common_iterations(ops: pd.DataFrame) -> list[pd.DataFrame]:
    """The profiled iterations that ran the most common unit sequence."""
    iterations = [it.reset_index(drop=True) for _, it in ops.groupby(ot.ITERATION, sort=True)]
    if not iterations:
        raise TemplateError("the captured rank has no profiled iteration")
    signatures = [tuple(map(tuple, it[list(_KEY)].astype(str).to_numpy())) for it in iterations]
    common, _ = Counter(signatures).most_common(1)[0]
    return [it for it, sig in zip(iterations, signatures, strict=True) if sig == common]


def _axis(label: str, layout: ParallelLayout) -> str:
    axis = label.split(".")[0]
    if axis not in kind_codes(layout):  # the groups a graph can bind collectives to
        raise TemplateError(
            f"a collective on group {label!r}, which is not a group of {layout}; "
            "capture at a layout whose groups the program builds"
        )
    return axis


def _p2p_dir(peer: int, rank: int, layout: ParallelLayout) -> int:
    """The stage offset of ``peer`` from ``rank`` in their pipeline: +1 the next stage, -1 the
    previous, -(pp - 1) from the last stage to the first (interleaved schedules wrap around)."""
    if not layout.same_pipeline(rank, peer) or peer == rank:
        raise TemplateError(
            f"rank {rank} sends to or receives from rank {peer}, which is not in its pipeline in {layout}; "
            "graphs of programs carry point-to-point transfers between pipeline stages only (if the "
            "program builds a pipeline of another length or order, capture with its --pp and --order)"
        )
    return layout.stage(peer) - layout.stage(rank)


def _memory(iteration: pd.DataFrame) -> np.ndarray:
    """(alloc, free) per unit, with what the Python between two ops allocates and frees (dropped
    references, zero_grad, FSDP's resharding hooks): a gap that frees more than it allocates is
    freed at the end of the unit before it, one that allocates more at the start of the unit
    after it, so that neither raises the peak by memory that was gone before the next op began."""
    alloc = iteration[ot.ALLOC_BYTES].to_numpy(dtype=np.int64).copy()
    free = iteration[ot.FREE_BYTES].to_numpy(dtype=np.int64).copy()
    net = iteration[ot.GAP_ALLOC_BYTES].to_numpy(dtype=np.int64) - iteration[ot.GAP_FREE_BYTES].to_numpy(
        dtype=np.int64
    )
    if len(net):
        first = net[0]  # nothing before the first unit in the iteration: it takes its own gap
        alloc[0] += max(first, 0)
        free[0] += max(-first, 0)
        alloc[1:] += np.maximum(net[1:], 0)
        free[:-1] += np.maximum(-net[1:], 0)
    return np.stack([alloc, free])


def timed_kinds(units: pd.DataFrame) -> list[str | None]:
    """Each unit's phase as the capture's phase timer counts its time
    (``prism.capture.phase_timer.own_phase_ns``): a block's units its own, the units between two
    blocks the next block's, those before the first block and after the last glue (None)."""
    kinds = [block_kind(phase) for phase in units[ot.PHASE].astype(str)]
    blocks = [i for i, kind in enumerate(kinds) if kind is not None]
    if not blocks:
        return kinds
    out: list[str | None] = [None] * len(kinds)
    following = None
    for i in range(blocks[-1], blocks[0] - 1, -1):
        following = kinds[i] if kinds[i] is not None else following
        out[i] = following
    return out


def fitted_scale(ops: pd.DataFrame, scale: TimeScale) -> TimeScale:
    """``scale`` with each phase's factor taken against what the stage program holds of it
    (``TimeScale.fitted``): the mean own time of its units over the profiled iterations, cut as
    the phase timer cuts (``timed_kinds``)."""
    iterations = common_iterations(ops)
    units = iterations[0][[ot.IS_COMM]].copy()
    units[ot.DUR_NS], units[ot.GAP_NS] = _mean_times(iterations)
    kinds = [GLUE if kind is None else kind for kind in timed_kinds(iterations[0])]
    return scale.fitted({kind: own_ns(part) for kind, part in units.groupby(np.array(kinds), sort=True)})


def _mean_times(iterations: list[pd.DataFrame]) -> tuple[np.ndarray, np.ndarray]:
    """Each unit's mean duration and gap over ``iterations`` (ns)."""
    dur, gap = (
        np.mean([it[column].to_numpy(dtype=np.float64) for it in iterations], axis=0)
        for column in (ot.DUR_NS, ot.GAP_NS)
    )
    return dur, gap


def _factors(units: pd.DataFrame, scale: TimeScale | None) -> np.ndarray:
    """Each unit's profiler correction: the factor of its phase as the timer counts it
    (``timed_kinds``; glue's outside every phase mark)."""
    if scale is None:
        return np.ones(len(units))
    return np.array([scale.factor_of(kind) for kind in timed_kinds(units)])


def _units(
    iterations: list[pd.DataFrame], rank: int, layout: ParallelLayout, scale: TimeScale | None, launches: bool
) -> pd.DataFrame:
    """One iteration's units with mean durations and gaps (compute scaled by its phase's factor,
    the host part of posted transfers kept after them, and with ``launches`` each call's launch
    in its gap; ``profiler_overhead.scaled_times``)."""
    units = iterations[0].copy()
    is_comm = units[ot.IS_COMM].to_numpy(dtype=bool)
    factor = _factors(units, scale)
    dur, gap = _mean_times(iterations)
    kept = host_kept(units, launches=launches)
    units[ot.DUR_NS], units[ot.GAP_NS], units[ot.POST_NS] = scaled_times(
        dur, gap, is_comm, factor, kept=kept, launches=launches
    )
    # The profiler records no free of a block allocated before it started: the first profiled
    # iteration frees what the one before allocated unseen, so memory comes from the later ones.
    steady = iterations[1:] or iterations
    held = np.median([_memory(it) for it in steady], axis=0).astype(np.int64)
    units[ot.ALLOC_BYTES], units[ot.FREE_BYTES] = held[0], held[1]
    labels = units[ot.GROUP_LABEL].astype(str).to_numpy()
    ops = units[ot.COMM_OP].astype(str).to_numpy()
    is_p2p = is_comm & np.isin(ops, ("send", "recv"))
    units[GROUP_AXIS] = [
        _axis(lab, layout) if c and not p else "" for lab, c, p in zip(labels, is_comm, is_p2p, strict=True)
    ]
    peers = units[ot.PEER].to_numpy()
    units[P2P_DIR] = [
        _p2p_dir(int(peer), rank, layout) if p else 0 for peer, p in zip(peers, is_p2p, strict=True)
    ]
    units[MB] = -1
    # A program's marks name no model part; a split backward's weight runs keep theirs.
    units[ot.PART] = np.where(units[ot.PART].astype(str) == str(Part.WEIGHTS), str(Part.WEIGHTS), "")
    return units


def _wait_positions(units: pd.DataFrame) -> dict[int, list[int]]:
    """For each asynchronous call, the unit after which it is waited for: {position: [calls]}.

    Where the program called ``wait()`` on the call's Work (``first_wait_ns``), after the last
    unit that began before then; else, for a call made during a backward pass (DDP's reducer,
    which waits from C++), where that backward pass ends; else right after the call."""
    is_comm = units[ot.IS_COMM].to_numpy(dtype=bool)
    backward = np.array([name.startswith(BACKWARD_OPS) for name in units[ot.NAME].astype(str)], dtype=bool)
    is_async = is_comm & units[ot.IS_ASYNC].to_numpy(dtype=bool)
    starts = units[ot.START_NS].to_numpy(dtype=np.int64)
    waited = (
        units[ot.FIRST_WAIT_NS].to_numpy(dtype=np.int64)
        if ot.FIRST_WAIT_NS in units
        else np.zeros(len(units))
    )
    waits: dict[int, list[int]] = {}
    for call in np.flatnonzero(is_async):
        at = int(call)
        before = np.flatnonzero(~is_comm[:call])
        if waited[call] > 0:
            at = max(at, int(np.searchsorted(starts, waited[call], side="right")) - 1)
        elif len(before) and backward[before[-1]]:  # issued during a backward pass: waited where it ends
            while at + 1 < len(units) and (backward[at + 1] or is_comm[at + 1]):
                at += 1
        waits.setdefault(at, []).append(int(call))
    return waits


def program_stage(
    ops: pd.DataFrame,
    *,
    rank: int,
    stage: int,
    layout: ParallelLayout,
    scale: TimeScale | None = None,
    launches: bool = False,
    noise_cv: float = 0.0,
    call_jitter_ns: float = 0.0,
    retarget: LayerTarget | None = None,
    microbatches: MicrobatchTarget | None = None,
    target: ParallelLayout | None = None,
    warmup: int | None = None,
    layer_shift: int = 0,
) -> StageProgram:
    """The nodes every rank of ``stage`` runs, from the op table ``ops`` of captured ``rank``.

    ``scale`` takes compute and gaps to the unprofiled iteration (the captured rank's profiler
    correction, per phase where it has one); ``launches`` (a CUDA capture) keeps each call's
    captured host time, its launch, in the gap before it; ``noise_cv`` and ``call_jitter_ns``
    give collectives their arrival skew; ``retarget`` makes the stage walk another layer count
    (``prism.graph.build.layer_passes``), ``microbatches`` run another microbatch count
    (``prism.graph.build.microbatch_steps``); ``target`` the layout the graph binds it to, where its
    groups have other sizes than ``layout``'s, the captured one; ``warmup`` the forward steps it runs
    before its first backward's pair at the target's pipeline depth (``prism.graph.build.pipeline_depth``),
    ``layer_shift`` what its layers' numbers move by there (layers numbered across the stack)."""
    iterations = common_iterations(ops)
    units = _units(iterations, rank, layout, scale, launches)
    if layer_shift:
        units[ot.LAYER] = np.where(units[ot.LAYER] >= 0, units[ot.LAYER] + layer_shift, units[ot.LAYER])
    waits = _wait_positions(units)
    held = 0
    if retarget is not None:
        units, waits, held = retarget_units(units, iterations, waits, retarget)
    change = None
    if microbatches is not None:
        units, waits, change = retarget_microbatches(units, iterations, waits, microbatches, rows=len(ops))
    if warmup is not None:
        units, waits = change_warmup(units, waits, warmup)
    pieces, start = [], 0
    for position in sorted(waits):  # a wait node after each unit that ends some calls' flight
        pieces.append(units.iloc[start : position + 1])
        # Node indices count the wait nodes inserted before them.
        deps = [call + sum(1 for p in waits if p < call) for call in waits[position]]
        pieces.append(wait_node(deps, units[ot.PHASE].iloc[position]))
        start = position + 1
    pieces.append(units.iloc[start:])
    nodes = finish_nodes(pieces)
    bound = target or layout
    sizes = {kind: axis_size(bound, kind) for kind in kind_codes(bound)}
    nodes[SKEW], nodes[OVERLAP] = waiting_columns(nodes, sizes, noise_cv, call_jitter_ns)
    return StageProgram(stage=stage, src_rank=rank, nodes=nodes, microbatches=change, held_bytes=held)
