"""Which program each rank of a graph runs: its pipeline stage's, or a variant of it.

A program's ranks of one stage run the same calls unless the program singles some out along an
axis: the first rank of each cp group logs a loss over its dp group, the others never call it.
Captured with ``--roles axis-ends`` (``prism.graph.build.rank_variants`` finds them), a variant
of a stage binds the ranks of that stage from ``first_index`` on along one axis (1: all but the
first; the last index: the last alone) to another captured rank's program; the others run the
stage's. One variant a stage at most: a rank singled out on two axes ran neither captured program.

Program numbers: stage ``s`` is program ``s``; variant ``i`` (in the graph's list) is ``pp + i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.layout import ParallelLayout
from prism.schemas.layout_arrays import fine_coords


class VariantError(ValueError):
    """Variants that no rule can bind."""


@dataclass(frozen=True, kw_only=True)
class RankVariant:
    """The ranks of ``stage`` at ``first_index`` or later on ``axis`` run captured ``rank``'s program."""

    stage: int
    axis: str
    first_index: int
    rank: int
    """The captured rank whose calls they make (the stage's rank at the axis's last index)."""
    static_bytes: int
    """Bytes each of them holds across iterations (what ``rank`` held)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> RankVariant:
        return cls(stage=int(values["stage"]), axis=str(values["axis"]), first_index=int(values["first_index"]),
                   rank=int(values["rank"]), static_bytes=int(values["static_bytes"]))  # fmt: skip


def rank_variants(metadata: GraphMetadata) -> list[RankVariant]:
    """A graph's rank variants (``gf.RANK_VARIANTS_KEY``): none in most graphs."""
    return [RankVariant.from_dict(v) for v in metadata.extra.get(gf.RANK_VARIANTS_KEY) or ()]


def check_variants(layout: ParallelLayout, variants: Sequence[RankVariant]) -> None:
    """VariantError unless every variant names a stage and an axis of it, one a stage."""
    seen: dict[int, str] = {}
    for v in variants:
        if (
            not 0 <= v.stage < layout.pp
            or v.axis not in layout.stage_axes()
            or not 0 < v.first_index < layout.degree(v.axis)
        ):
            raise VariantError(
                f"a variant of stage {v.stage} from {v.axis} {v.first_index}: not a place on an axis of {layout}"
            )
        if v.stage in seen:
            raise VariantError(
                f"the ranks of pipeline stage {v.stage} call differently along both {seen[v.stage]} and {v.axis}: "
                f"a rank singled out on both ran neither captured program"
            )
        seen[v.stage] = v.axis


def program_of(layout: ParallelLayout, variants: Sequence[RankVariant], ranks: np.ndarray) -> np.ndarray:
    """The program number of each of ``ranks`` (module docstring)."""
    ranks = np.asarray(ranks, np.int64)
    fine = fine_coords(layout, ranks)
    out = fine["pp"].copy()
    for i, v in enumerate(variants):
        out[(fine["pp"] == v.stage) & (fine[v.axis] >= v.first_index)] = layout.pp + i
    return out


def ranks_per_program(layout: ParallelLayout, variants: Sequence[RankVariant]) -> np.ndarray:
    """How many ranks run each program (``program_of`` of every rank, counted) without listing the
    ranks: a stage's ranks hold every index of each of its axes equally often, so a variant from
    ``first_index`` on takes that share of its stage's."""
    per_stage = layout.world_size // layout.pp
    counts = np.array([per_stage] * layout.pp + [0] * len(variants), np.int64)
    for i, v in enumerate(variants):
        degree = layout.degree(v.axis)
        counts[layout.pp + i] = per_stage // degree * (degree - v.first_index)
        counts[v.stage] -= counts[layout.pp + i]
    return counts


def static_bytes_of_ranks(
    layout: ParallelLayout, stage_static: Sequence[int], variants: Sequence[RankVariant], ranks: np.ndarray
) -> np.ndarray:
    """Bytes each of ``ranks`` holds across iterations: its program's."""
    by_program = np.asarray([*stage_static, *(v.static_bytes for v in variants)], np.int64)
    return by_program[program_of(layout, variants, ranks)]
