"""Compose the program of one target pipeline stage from its role's templates.

Every rank of a stage runs the same sequence of nodes; only rank-bound columns (rank, group
index, collective id, peer, comm duration) differ, and ``extrapolate`` fills those in per rank.
The sequence follows the target's 1F1B schedule (``prism.schemas.pipeline_schedule``); forward
and backward segments are re-expanded to the target's layers per stage; the DP gradient sync
is re-planned with the target's buckets.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.build.templates import (
    BWD,
    FWD,
    GRAD_SYNC,
    GROUP_AXIS,
    LAYER_OFFSET,
    OPTIM,
    P2P_WAIT,
    POST,
    PRE,
    RoleTemplate,
    TemplateError,
)
from prism.graph.sim.noise import collective_skew_ns, work_in_flight
from prism.schemas.annotations import Direction, Phase, block_kind
from prism.schemas.grad_buckets import Bucket
from prism.schemas.graph_format import POST_NAME, WAIT_NAME
from prism.schemas.pipeline_schedule import Action, Step, one_f_one_b
from prism.schemas.pipeline_shape import PipelineShape

if TYPE_CHECKING:
    from prism.graph.build.microbatch_steps import MicrobatchChange

# Rank-independent columns of a stage program.
MB, LAYER, GSEQ, P2P_DIR, P2P_SEQ, DEPS, IS_WAIT, SKEW, OVERLAP = (
    "mb",
    "layer",
    "gseq",
    "p2p_dir",
    "p2p_seq",
    "deps",
    "is_wait",
    "skew_ns",
    "overlap_ns",
)

_STEP_KINDS = {
    Action.FORWARD: FWD,
    Action.BACKWARD: BWD,
    Action.RECV_FORWARD: block_kind(Phase.RECV, Direction.FORWARD),
    Action.SEND_FORWARD: block_kind(Phase.SEND, Direction.FORWARD),
    Action.RECV_BACKWARD: block_kind(Phase.RECV, Direction.BACKWARD),
    Action.SEND_BACKWARD: block_kind(Phase.SEND, Direction.BACKWARD),
    Action.WAIT: P2P_WAIT,
}
# Which neighbour a transfer talks to: +1 the next stage, -1 the previous one.
_P2P_DIR = {"send_fwd": 1, "recv_bwd": 1, "recv_fwd": -1, "send_bwd": -1}


@dataclass(frozen=True, kw_only=True)
class StageProgram:
    """The nodes every rank of one stage runs, in program order."""

    stage: int
    """Target pipeline stage."""
    src_rank: int
    """Captured rank whose templates it was built from."""
    nodes: pd.DataFrame
    """Template columns plus MB, LAYER, GSEQ, P2P_DIR, P2P_SEQ, DEPS, IS_WAIT, SKEW, OVERLAP."""
    microbatches: MicrobatchChange | None = None
    """A program's stage built at another microbatch count: how its captured steps repeat and
    what it holds besides."""
    held_bytes: int = 0
    """A program's stage built at another layer count: what its layers hold across iterations
    besides the captured static bytes and their parameters'."""


def _sections(steps: tuple[Step, ...]) -> list[tuple[str, str]]:
    """(kind, section) of each step: 'warmup' before the stage's first backward, 'cooldown' after
    its last forward, 'steady' between. The warm-up and cool-down sections hold as many
    instances of each kind whatever the microbatches (given enough of them); only 'steady' grows."""
    actions = [step.action for step in steps]
    first_backward = actions.index(Action.BACKWARD)
    last_forward = len(actions) - 1 - actions[::-1].index(Action.FORWARD)
    return [
        (_STEP_KINDS[a], "warmup" if i < first_backward else "cooldown" if i > last_forward else "steady")
        for i, a in enumerate(actions)
    ]


@dataclass(frozen=True)
class _Instance:
    """Where a target instance of a kind stands in its schedule section, and which captured
    instances of that kind (ordinals) ran in the same section."""

    ordinal: int
    count: int
    sources: tuple[int, ...]


def _instances(target: tuple[Step, ...], captured: tuple[Step, ...]) -> list[_Instance]:
    """For each target step, the captured instances whose memory stands for it: the same kind in
    the same schedule section (``_sections``), so that a warm-up forward's allocations come from
    a captured warm-up forward however many microbatches either iteration has."""
    by_section: dict[tuple[str, str], list[int]] = {}
    seen: Counter[str] = Counter()
    for key in _sections(captured):
        by_section.setdefault(key, []).append(seen[key[0]])
        seen[key[0]] += 1
    sections = _sections(target)
    counts = Counter(sections)
    position: Counter[tuple[str, str]] = Counter()
    instances = []
    for key in sections:
        instances.append(_Instance(position[key], counts[key], tuple(by_section.get(key, ()))))
        position[key] += 1
    return instances


def _segment(template: RoleTemplate, kind: str, mb: int = -1, at: _Instance | None = None) -> pd.DataFrame:
    """Units of ``kind`` in the target iteration (of instance ``at`` where it has several)."""
    if kind in (PRE, POST) and kind not in template.segments:
        return pd.DataFrame()
    segment = template.segment(kind)
    units = segment.units_at(at.ordinal, at.count, at.sources) if at else segment.units_at(0, 1)
    units[MB] = mb
    units[P2P_DIR] = _P2P_DIR.get(kind, 0)
    return units


def _layer_runs(units: pd.DataFrame) -> tuple[pd.DataFrame, list[pd.DataFrame], pd.DataFrame]:
    """(prefix, one run per layer in order of appearance, suffix) of a fwd/bwd segment."""
    is_layer = units[LAYER_OFFSET].to_numpy() >= 0
    if not is_layer.any():
        return units, [], units.iloc[0:0]
    first, last = np.flatnonzero(is_layer)[[0, -1]]
    middle = units.iloc[first : last + 1]
    # A new run starts wherever the layer offset changes to another layer.
    offsets = middle[LAYER_OFFSET].replace(-1, np.nan).ffill().to_numpy()
    starts = np.flatnonzero(np.r_[True, offsets[1:] != offsets[:-1]])
    runs = [middle.iloc[a:b] for a, b in zip(starts, np.r_[starts[1:], len(middle)], strict=True)]
    return units.iloc[:first], runs, units.iloc[last + 1 :]


def _source_run(target: int, targets: int, sources: int) -> int:
    """Which captured layer run stands for target layer ``target`` (positions, not indices)."""
    if target == 0:
        return 0
    if target == targets - 1:
        return sources - 1
    return min(1, sources - 1)  # a middle layer: neither the first nor the last of the stage


def _expand_layers(units: pd.DataFrame, first_layer: int, layers: int) -> pd.DataFrame:
    prefix, runs, suffix = _layer_runs(units)
    if not runs:
        return units
    backward = runs[0][LAYER_OFFSET].max() > runs[-1][LAYER_OFFSET].max()
    order = list(range(layers))[::-1] if backward else list(range(layers))
    pieces = [prefix]
    for position, layer in enumerate(order):
        run = runs[_source_run(position, layers, len(runs))].copy()
        run[LAYER] = np.where(run[LAYER_OFFSET] >= 0, first_layer + layer, -1)
        pieces.append(run)
    pieces.append(suffix)
    return pd.concat(pieces, ignore_index=True)


def wait_node(deps: list[int], phase: str, mb: int = -1) -> pd.DataFrame:
    """A zero-cost node that completes when the asynchronous nodes ``deps`` have."""
    return pd.DataFrame(
        {ot.NAME: [WAIT_NAME], ot.PHASE: [phase], MB: [mb], IS_WAIT: [True], DEPS: [list(deps)]}
    )


@dataclass(frozen=True, kw_only=True)
class GradBuckets:
    """The gradient buckets of a target stage and of the captured rank it is built from."""

    target: list[Bucket]
    captured: list[Bucket]
    itemsize: int
    """Bytes per gradient element."""


def _rescale_grad_sync(
    units: pd.DataFrame, buckets: GradBuckets, shape: PipelineShape, captured: PipelineShape
) -> pd.DataFrame:
    """The captured gradient sync re-planned for the target's buckets.

    Each target bucket copies the captured bucket closest in size, its compute scaled by the
    size ratio (copying gradients in and out is bandwidth-bound) and its all-reduce carrying
    the target bucket's bytes. Units outside any bucket scale with the total.
    """
    itemsize, target, source = buckets.itemsize, buckets.target, buckets.captured
    has_comm = bool((units[ot.IS_COMM] & (units[GROUP_AXIS] == "dp")).any())
    if shape.dp > 1 and not has_comm:
        raise TemplateError(
            f"the capture ran with dp={captured.dp}, so it holds no gradient all-reduce to extrapolate to "
            f"dp={shape.dp}; capture with dp >= 2"
        )
    if [b.numel for b in target] == [b.numel for b in source] and (shape.dp > 1) == has_comm:
        return units
    bucket = units[ot.BUCKET].to_numpy()
    in_bucket = bucket >= 0
    first = np.flatnonzero(in_bucket)[0] if in_bucket.any() else len(units)
    head, tail = units.iloc[:first], units.iloc[first:][~in_bucket[first:]]
    total_ratio = sum(b.numel for b in target) / max(1, sum(b.numel for b in source))
    pieces = [head]
    for b in target:
        closest = min(source, key=lambda s: abs(s.numel - b.numel))
        piece = units[bucket == closest.index].copy()
        piece[ot.BUCKET] = b.index
        _scale_compute(piece, b.numel / max(1, closest.numel))
        piece.loc[piece[ot.IS_COMM], ot.BYTES] = b.numel * itemsize
        pieces.append(piece)
    tail = tail.copy()
    _scale_compute(tail, total_ratio)
    pieces.append(tail)
    out = pd.concat(pieces, ignore_index=True)
    return out if shape.dp > 1 else out[~out[ot.IS_COMM]].reset_index(drop=True)


def _scale_compute(units: pd.DataFrame, ratio: float) -> None:
    compute = ~units[ot.IS_COMM].to_numpy(dtype=bool)
    for column in (ot.DUR_NS, ot.ALLOC_BYTES, ot.FREE_BYTES):
        values = units[column].to_numpy(dtype=np.float64)
        units[column] = np.where(compute, np.round(values * ratio), values).astype(np.int64)


class _ProgramBuilder:
    """Appends segments and keeps track of asynchronous nodes still to be waited for."""

    def __init__(self) -> None:
        self.pieces: list[pd.DataFrame] = []
        self.size = 0
        self.pending: list[int] = []

    def add(self, frame: pd.DataFrame) -> None:
        if frame.empty:
            return
        frame = frame.reset_index(drop=True)
        if ot.IS_ASYNC in frame:
            is_async = frame[ot.IS_COMM].fillna(False).astype(bool) & frame[ot.IS_ASYNC].fillna(False).astype(
                bool
            )
            self.pending += (self.size + np.flatnonzero(is_async.to_numpy())).tolist()
        self.pieces.append(frame)
        self.size += len(frame)

    def wait(self, phase: str) -> None:
        self.add(wait_node(self.pending, phase))
        self.pending = []


_DEFAULTS = {
    ot.IS_COMM: False, ot.IS_ASYNC: False, ot.COMM_OP: "", ot.DTYPE: "", ot.PART: "", GROUP_AXIS: "",
    ot.DUR_NS: 0, ot.GAP_NS: 0, ot.ALLOC_BYTES: 0, ot.FREE_BYTES: 0, ot.BYTES: 0, ot.BUCKET: -1,
    ot.SEQ: -1, LAYER_OFFSET: -1, LAYER: -1, MB: -1, P2P_DIR: 0, IS_WAIT: False, ot.SPLIT_BYTES: "",
}  # fmt: skip


def compose_stage(
    template: RoleTemplate, *, shape: PipelineShape, captured: PipelineShape, stage: int, buckets: GradBuckets
) -> StageProgram:
    """The program of every rank of target ``stage`` of ``shape`` (a role captured at ``captured``), from a role's templates, its
    gradient sync re-planned for the stage's ``buckets``."""
    program = _ProgramBuilder()
    program.add(_segment(template, PRE))
    first_layer = shape.stage_layers(stage).start
    steps = one_f_one_b(stage=stage, stages=shape.pp, microbatches=shape.microbatches)
    ran = one_f_one_b(stage=template.stage, stages=captured.pp, microbatches=captured.microbatches)
    for step, at in zip(steps, _instances(steps, ran), strict=True):
        kind = _STEP_KINDS[step.action]
        if step.action == Action.WAIT:
            if P2P_WAIT in template.segments:
                program.add(_segment(template, P2P_WAIT, -1, at))
            program.wait(P2P_WAIT)
            continue
        units = _segment(template, kind, step.mb, at)
        if kind in (FWD, BWD):
            units = _expand_layers(units, first_layer, shape.layers_per_stage)
        program.add(units)
    program.pending = []  # every transfer was waited for by the schedule's last WAIT
    # With dp = 1 the workload opens its grad-sync marks but runs nothing inside them.
    no_sync = GRAD_SYNC not in template.segments and shape.dp == 1
    if GRAD_SYNC not in template.segments and shape.dp > 1 and captured.dp == 1:
        raise TemplateError(
            f"the capture ran dp=1, so it has no gradient sync to scale to dp={shape.dp}: capture at dp >= 2 "
            "(the slice still runs one real rank per role)"
        )
    sync = (
        pd.DataFrame()
        if no_sync
        else _rescale_grad_sync(_segment(template, GRAD_SYNC), buckets, shape, captured)
    )
    sync = _finish_columns(sync)
    is_async = (sync[ot.IS_COMM].astype(bool) & sync[ot.IS_ASYNC].astype(bool)).to_numpy(dtype=bool)
    split = np.flatnonzero(is_async)[-1] + 1 if is_async.any() else len(sync)
    program.add(sync.iloc[:split])
    if is_async.any():
        program.wait(GRAD_SYNC)
    program.add(sync.iloc[split:])
    program.add(_segment(template, OPTIM))
    program.add(_segment(template, POST))
    nodes = finish_nodes(program.pieces)
    sizes = {"tp": shape.tp, "dp": shape.dp, "world": shape.layout.world_size}
    nodes[SKEW], nodes[OVERLAP] = waiting_columns(nodes, sizes, template.noise_cv, template.call_jitter_ns)
    return StageProgram(stage=stage, src_rank=template.rank, nodes=nodes)


def waiting_columns(
    nodes: pd.DataFrame, sizes: dict[str, int], noise_cv: float, call_jitter_ns: float
) -> tuple[np.ndarray, np.ndarray]:
    """(SKEW, OVERLAP) of a stage program: each collective's expected arrival skew over groups of
    ``sizes`` (``prism.graph.sim.noise``), and each asynchronous call's compute and gaps while it
    is in flight (up to its wait; posts left out: a post is the call's own host work, which runs
    the call rather than competing with it). What a rank does by itself: a compute node's duration after its arrival,
    plus every gap."""
    is_comm = nodes[ot.IS_COMM].to_numpy(dtype=bool)
    own = np.where(is_comm, 0, nodes[ot.DUR_NS].to_numpy(dtype=np.int64))
    gap = nodes[ot.GAP_NS].to_numpy(dtype=np.int64)
    work = own + gap
    is_coll = is_comm & (nodes[P2P_DIR].to_numpy() == 0)
    axis = np.where(is_coll, nodes[GROUP_AXIS].to_numpy(dtype=object), "").astype(str)
    skew = collective_skew_ns(work, own, axis, sizes, noise_cv, call_jitter_ns)
    in_flight = np.flatnonzero(is_comm & nodes[ot.IS_ASYNC].to_numpy(dtype=bool))
    overlap = np.zeros(len(is_comm), np.int64)
    if len(in_flight):
        computing = np.where(nodes[ot.NAME].to_numpy() == POST_NAME, 0, own)
        overlap[in_flight] = work_in_flight(computing, gap, in_flight, *deps_csr(nodes))
    return skew, overlap


def deps_csr(nodes: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The DEPS column of finished nodes (``finish_nodes``: a list each) as (offsets, values),
    int32: node ``i`` depends on ``values[offsets[i]:offsets[i + 1]]``."""
    deps = nodes[DEPS]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in deps])]).astype(np.int32)
    values = np.array([i for d in deps for i in d], np.int32)
    return offsets, values


def _finish_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with at least the comm flags, so an empty segment can be split like any other."""
    for column in (ot.IS_COMM, ot.IS_ASYNC):
        if column not in frame:
            frame[column] = pd.Series(dtype=bool)
    return frame


def _posts_after_calls(nodes: pd.DataFrame) -> pd.DataFrame:
    """``nodes`` with each call's post (``ot.POST_NS``) as a compute node of the call's right after
    it: gloo's post begins the transfer and the program goes on once it is done
    (``profiler_overhead.scaled_times``). Dependencies are renumbered."""
    post = nodes.pop(ot.POST_NS).fillna(0).to_numpy(dtype=np.int64) if ot.POST_NS in nodes else None
    if post is None or not (post > 0).any():
        return nodes
    calls = np.flatnonzero(post > 0)
    position = np.arange(len(nodes)) + np.r_[0, np.cumsum(post > 0)[:-1]]
    if DEPS in nodes:
        nodes[DEPS] = [
            [int(position[d]) for d in deps] if isinstance(deps, list) else deps for deps in nodes[DEPS]
        ]
    posts = pd.DataFrame(
        {
            ot.NAME: POST_NAME,
            ot.PHASE: nodes[ot.PHASE].to_numpy()[calls],
            MB: nodes[MB].to_numpy()[calls] if MB in nodes else -1,
            ot.SEQ: nodes[ot.SEQ].to_numpy()[calls] if ot.SEQ in nodes else -1,
            ot.DUR_NS: post[calls],
        },
        index=position[calls] + 1,
    )
    return pd.concat([nodes.set_axis(position), posts]).sort_index().reset_index(drop=True)


def finish_nodes(pieces: list[pd.DataFrame]) -> pd.DataFrame:
    """The pieces of a stage program as one frame: every column filled, each post a node after its
    call, sequence numbers of its calls."""
    nodes = _posts_after_calls(pd.concat(pieces, ignore_index=True))
    for column, default in _DEFAULTS.items():
        if column not in nodes:
            nodes[column] = default
        else:
            values = nodes[column].astype(object)
            nodes[column] = values.where(values.notna(), default).astype(type(default))
    if DEPS not in nodes:
        nodes[DEPS] = None
    nodes[DEPS] = [d if isinstance(d, list) else [] for d in nodes[DEPS]]
    is_comm = nodes[ot.IS_COMM].to_numpy(dtype=bool)
    is_p2p = is_comm & (nodes[P2P_DIR].to_numpy() != 0)
    is_coll = is_comm & ~is_p2p
    nodes[P2P_DIR] = np.where(is_p2p, nodes[P2P_DIR], 0)
    nodes[GSEQ] = np.where(is_coll, nodes.groupby(np.where(is_coll, nodes[GROUP_AXIS], "")).cumcount(), -1)
    p2p_key = nodes[P2P_DIR].astype(str) + nodes[ot.COMM_OP]
    nodes[P2P_SEQ] = np.where(is_p2p, nodes.groupby(p2p_key).cumcount(), -1)
    return nodes
