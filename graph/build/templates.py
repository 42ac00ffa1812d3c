"""Block templates: what one role does in each kind of program piece, with its timings and memory.

A captured iteration of a role is cut into *segments* that map one-to-one onto the steps of
its 1F1B schedule: ``pre`` (before the first step), one per step (``fwd``/``bwd`` of a
microbatch, each posted transfer, each wait), ``grad_sync``, ``optim`` and ``post``. Units
outside every block (Python glue between steps) belong to the next segment.

Instances of one kind (every microbatch of every profiled iteration) must run the same op
sequence; the most common sequence is kept. Each unit's duration and gap are the *mean* over
the instances that ran it: op durations are skewed to the right, and a sum of per-unit medians
falls short of the time the iterations really took, while a sum of means reproduces it. Memory is kept per *ordinal*, the
instance's position among its kind in the iteration (median over iterations): the first
forwards of a pipeline stage allocate receive buffers that later ones reuse and the last
backwards free them, so one steady value per unit would miss a stage's peak.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.schemas.annotations import Phase, block_kind

PRE, POST = "pre", "post"
FWD, BWD = Phase.FORWARD.value, Phase.BACKWARD.value
P2P_WAIT, GRAD_SYNC, OPTIM = Phase.P2P_WAIT.value, Phase.GRAD_SYNC.value, Phase.OPTIMIZER.value

# Columns of a template (besides the op-table ones copied through).
LAYER_OFFSET = "layer_offset"
GROUP_AXIS = "group_axis"
MEAN_COLUMNS = (ot.DUR_NS, ot.GAP_NS)
MEMORY_COLUMNS = (ot.ALLOC_BYTES, ot.FREE_BYTES)
COPIED_COLUMNS = (
    ot.PHASE,
    ot.NAME,
    ot.IS_COMM,
    ot.COMM_OP,
    ot.BYTES,
    ot.SPLIT_BYTES,
    ot.DTYPE,
    ot.IS_ASYNC,
    ot.PART,
    ot.BUCKET,
    ot.SEQ,
)


class TemplateError(ValueError):
    """A capture whose blocks cannot be turned into templates."""


@dataclass(frozen=True, kw_only=True)
class Segment:
    """Template of one kind of segment."""

    kind: str
    """pre, fwd, bwd, send_fwd, recv_fwd, send_bwd, recv_bwd, p2p_wait, grad_sync, optim, post."""
    units: pd.DataFrame
    """One row per unit, in order (COPIED_COLUMNS, MEAN_COLUMNS, MEMORY_COLUMNS, LAYER_OFFSET,
    GROUP_AXIS); memory is the median over every agreeing instance (the steady value)."""
    instances: int
    """Instances of the kind in the profiled iterations."""
    agreeing: int
    """Instances that ran the kept op sequence."""
    memory_by_ordinal: np.ndarray
    """(ordinals, units, 2) int64: alloc and free bytes of each unit for the instance at each
    position of the iteration (median over iterations; the steady value where none agreed)."""

    def units_at(self, ordinal: int, count: int, sources: Sequence[int] | None = None) -> pd.DataFrame:
        """The units for the ``ordinal``-th of ``count`` target instances of the kind that
        ``sources`` (captured ordinals, in order; default: every captured one) stand for.

        The sources' first half stands for the target's first instances and their second half
        for its last ones, so warm-up and cool-down allocations land where they did; instances
        in between (more microbatches than captured) take the sources' steady value: per unit,
        the sources' median, the lower of the two middle values for an even count (a value some
        instance allocated, never a mean of two).
        """
        rows = self.memory_by_ordinal
        sources = [s for s in (range(len(rows)) if sources is None else sources) if s < len(rows)]
        units = self.units.copy()
        if not sources:
            return units
        captured = len(sources)
        head = (captured + 1) // 2
        tail = captured - head
        if count - ordinal <= tail:
            memory = rows[sources[captured - (count - ordinal)]]
        elif ordinal < head:
            memory = rows[sources[ordinal]]
        else:
            memory = np.sort(rows[sources], axis=0)[(captured - 1) // 2]
        units[ot.ALLOC_BYTES] = memory[:, 0]
        units[ot.FREE_BYTES] = memory[:, 1]
        return units


@dataclass(frozen=True, kw_only=True)
class RoleTemplate:
    """Everything the graph builder reuses of one captured rank."""

    rank: int
    """Captured global rank."""
    stage: int
    """Its pipeline stage."""
    first_layer: int
    """Global index of the stage's first layer."""
    segments: dict[str, Segment]
    """Templates by segment kind."""
    noise_cv: float = 0.0
    """Coefficient of variation of the rank's iteration time (``prism.graph.sim.noise``)."""
    call_jitter_ns: float = 0.0
    """Noise floor of the time between the rank's consecutive calls (``prism.graph.sim.noise``)."""

    def segment(self, kind: str) -> Segment:
        try:
            return self.segments[kind]
        except KeyError:
            raise TemplateError(f"captured rank {self.rank} never ran a {kind!r} segment") from None


def _is_transfer(kind: str) -> bool:
    return kind.startswith((Phase.SEND.value + "_", Phase.RECV.value + "_"))


def split_segments(iteration: pd.DataFrame) -> list[tuple[str, int, pd.DataFrame]]:
    """Cut one iteration's units (in program order) into (kind, microbatch, units) segments."""
    kinds = [block_kind(p, d) for p, d in zip(iteration[ot.PHASE], iteration[ot.DIR], strict=True)]
    mbs = iteration[ot.MB].to_numpy()
    segments: list[tuple[str, int, list[int]]] = []
    glue: list[int] = []
    for i, kind in enumerate(kinds):
        if kind is None:
            glue.append(i)
            continue
        mb = int(mbs[i]) if kind in (FWD, BWD) or _is_transfer(kind) else -1
        if segments and not glue and segments[-1][0] == kind and segments[-1][1] == mb:
            segments[-1][2].append(i)
            continue
        if glue and not segments:
            segments.append((PRE, -1, glue))  # before the first step: zeroing gradients etc.
            glue = []
        segments.append((kind, mb, glue + [i]))
        glue = []
    if glue:
        segments.append((POST, -1, glue))
    return [(kind, mb, iteration.iloc[rows]) for kind, mb, rows in segments]


def _signature(units: pd.DataFrame, first_layer: int) -> tuple:
    layers = units[ot.LAYER].to_numpy()
    offsets = np.where(layers >= 0, layers - first_layer, -1)
    return tuple(zip(units[ot.NAME], offsets.tolist(), units[ot.PART], strict=True))


def _values(units: pd.DataFrame, column: str) -> np.ndarray:
    values = units[column].to_numpy(dtype=np.int64)
    # Memory allocated or freed between two ops (Python glue) is charged to the op after it.
    gap_column = {ot.ALLOC_BYTES: ot.GAP_ALLOC_BYTES, ot.FREE_BYTES: ot.GAP_FREE_BYTES}.get(column)
    if gap_column is not None and gap_column in units:
        values = values + units[gap_column].to_numpy(dtype=np.int64)
    return values


def _template(kind: str, instances: list[tuple[int, pd.DataFrame]], first_layer: int) -> Segment:
    """Segment template from ``(ordinal, units)`` of every instance of one kind."""
    signatures = [_signature(units, first_layer) for _, units in instances]
    kept, _ = Counter(signatures).most_common(1)[0]
    agreeing = [(o, units) for (o, units), sig in zip(instances, signatures, strict=True) if sig == kept]
    first = agreeing[0][1]
    template = first[list(COPIED_COLUMNS)].reset_index(drop=True).copy()
    for column in MEAN_COLUMNS:
        stacked = np.stack([_values(units, column) for _, units in agreeing])
        template[column] = stacked.mean(axis=0).round().astype(np.int64)
    memory = np.stack(
        [np.stack([_values(units, column) for column in MEMORY_COLUMNS], axis=1) for _, units in agreeing]
    )  # (instances, units, 2)
    steady = np.median(memory, axis=0).round().astype(np.int64)
    for i, column in enumerate(MEMORY_COLUMNS):
        template[column] = steady[:, i]
    ordinals = np.array([o for o, _ in agreeing])
    by_ordinal = np.repeat(steady[None], max(o for o, _ in instances) + 1, axis=0)
    for o in np.unique(ordinals):
        by_ordinal[o] = np.median(memory[ordinals == o], axis=0).round().astype(np.int64)
    template[LAYER_OFFSET] = [offset for _, offset, _ in kept]
    template[GROUP_AXIS] = first[ot.GROUP_LABEL].str.split(".").str[0].fillna("").to_numpy()
    return Segment(
        kind=kind,
        units=template,
        instances=len(instances),
        agreeing=len(agreeing),
        memory_by_ordinal=by_ordinal,
    )


def build_role_template(ops: pd.DataFrame, *, rank: int, stage: int, first_layer: int) -> RoleTemplate:
    """Templates of every segment kind of one captured rank's op table."""
    by_kind: dict[str, list[tuple[int, pd.DataFrame]]] = {}
    for _, iteration in ops.groupby(ot.ITERATION, sort=True):
        seen: Counter[str] = Counter()
        for kind, _, units in split_segments(iteration.sort_values(ot.SEQ)):
            by_kind.setdefault(kind, []).append((seen[kind], units))
            seen[kind] += 1
    if FWD not in by_kind or BWD not in by_kind:
        raise TemplateError(f"captured rank {rank} has no forward/backward blocks in its profiled iterations")
    segments = {kind: _template(kind, instances, first_layer) for kind, instances in by_kind.items()}
    return RoleTemplate(rank=rank, stage=stage, first_layer=first_layer, segments=segments)
