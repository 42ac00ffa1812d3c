"""Which program each rank runs: its stage's, or the variant of the axis it is past the first on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.graph.comm.placement import LayoutTables
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.layout import ParallelLayout
from prism.schemas.rank_programs import (
    RankVariant,
    VariantError,
    check_variants,
    program_of,
    rank_variants,
    ranks_per_program,
    static_bytes_of_ranks,
)
from tests.unit.test_mesh import meshes


@settings(max_examples=60, deadline=None)
@given(meshes(), st.data())
def test_each_rank_runs_the_variant_of_the_axis_it_is_past_the_first_on(layout: ParallelLayout, data) -> None:
    axes = [a for a in layout.stage_axes() if layout.degree(a) > 1]
    if not axes:
        return
    stages = data.draw(st.lists(st.integers(0, layout.pp - 1), unique=True, max_size=layout.pp))
    variants = []
    for s in stages:
        axis = data.draw(st.sampled_from(axes))
        first = data.draw(st.sampled_from([1, layout.degree(axis) - 1]))
        variants.append(RankVariant(stage=s, axis=axis, first_index=first, rank=0, static_bytes=1000 + s))
    check_variants(layout, variants)
    found = program_of(layout, variants, np.arange(layout.world_size))
    stage_static = [10 * s for s in range(layout.pp)]
    static = static_bytes_of_ranks(layout, stage_static, variants, np.arange(layout.world_size))
    for rank in range(layout.world_size):
        fine, stage = layout.fine_coords(rank), layout.stage(rank)
        mine = [i for i, v in enumerate(variants) if v.stage == stage and fine[v.axis] >= v.first_index]
        assert found[rank] == (layout.pp + mine[0] if mine else stage)
        assert static[rank] == (1000 + stage if mine else 10 * stage)
    # Counted without listing the ranks, as a build sizes a graph before it makes one.
    counted = ranks_per_program(layout, variants)
    assert counted.tolist() == np.bincount(found, minlength=layout.pp + len(variants)).tolist()


def test_a_stage_differing_along_two_axes_is_refused() -> None:
    layout = ParallelLayout(tp=2, pp=1, dp=2, cp=2)
    two = [
        RankVariant(stage=0, axis="cp", first_index=1, rank=2, static_bytes=0),
        RankVariant(stage=0, axis="tp", first_index=1, rank=1, static_bytes=0),
    ]
    with pytest.raises(VariantError, match="differently along both cp and tp"):
        check_variants(layout, two)
    with pytest.raises(VariantError, match="not a place"):
        check_variants(layout, [RankVariant(stage=0, axis="ep", first_index=1, rank=1, static_bytes=0)])
    with pytest.raises(VariantError, match="not a place"):
        check_variants(layout, [RankVariant(stage=0, axis="cp", first_index=2, rank=2, static_bytes=0)])


def test_variants_read_from_a_graphs_metadata_and_none_from_older_graphs() -> None:
    variant = RankVariant(stage=0, axis="cp", first_index=1, rank=1, static_bytes=123)
    extra = {gf.RANK_VARIANTS_KEY: [variant.to_dict()]}
    empty = GraphMetadata(
        layout={}, model={}, cluster={}, capture_digest="", build_options={}, prism_version=""
    )
    assert rank_variants(replace(empty, extra=extra)) == [variant]
    assert rank_variants(empty) == []


def test_replicas_that_run_different_programs_are_not_folded_together() -> None:
    # dp=4 x cp=2: the first dp replica's ranks run the stage's program, the others a variant's
    # (a program whose dp rank 0 does more): replica 0 stands alone, 1-3 repeat one another.
    layout = ParallelLayout(tp=1, pp=1, dp=4, cp=2)
    tables = LayoutTables.build(layout, gpus_per_node=8)
    assert tables.replica_of().tolist() == [0, 0, 0, 0]
    variants = [RankVariant(stage=0, axis="dp_shard", first_index=1, rank=6, static_bytes=0)]
    assert tables.replica_of(program_of(layout, variants, np.arange(8))).tolist() == [0, 1, 1, 1]
