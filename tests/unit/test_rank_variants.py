"""Which captured rank's calls the ranks of a stage run, from the ranks ``--roles axis-ends``
captured: the first singled out, the last singled out, or a difference no rule binds."""

from __future__ import annotations

import pytest

from prism.graph.build.rank_variants import find_variants, variant_line
from prism.graph.build.templates import TemplateError
from prism.schemas.layout import ParallelLayout, Role
from prism.schemas.manifest import CapturedRank, RankResult

LAYOUT = ParallelLayout(tp=1, pp=1, dp=2, cp=4)  # stage 0: rank 0; cp 1 is rank 1, its end rank 3; dp's end 4
SAME = [("all_reduce", "world", 64, "float32", 0)]
LOG = [("all_reduce", "dp", 4, "float32", 0), *SAME]


def captured(rank: int) -> CapturedRank:
    result = RankResult(rank=rank, iteration_ns=(1,), losses=(None,), parameter_count=0, peak_rss_bytes=0,
                        peak_device_bytes=None, wall_s=0.0, static_bytes=100 + rank)  # fmt: skip
    return CapturedRank(rank=rank, role=Role.SINGLE, stage=0, kineto="", et="", comm="", result=result)


def variants_of(calls: dict[int, list]) -> list:
    return find_variants(LAYOUT, {0: [captured(r) for r in sorted(calls)]}, calls.__getitem__)


def test_ranks_that_call_alike_bind_no_variant() -> None:
    assert variants_of({0: SAME, 1: SAME, 3: SAME, 4: SAME}) == []


def test_a_program_that_singles_out_each_groups_first_rank_binds_the_rest_to_the_end() -> None:
    ((variant, end, why),) = variants_of({0: LOG, 1: SAME, 3: SAME, 4: LOG})
    assert (variant.axis, variant.first_index, variant.rank, variant.static_bytes, end.rank) == (
        "cp",
        1,
        3,
        103,
        3,
    )
    line = variant_line(variant, LAYOUT, why)
    assert line.startswith("the ranks of pipeline stage 0 at cp 1..3 run captured rank 3's calls")
    assert "rank 0 made all_reduce on group dp" in line


def test_a_program_that_singles_out_each_groups_last_rank_binds_the_last_alone() -> None:
    ((variant, _, why),) = variants_of({0: SAME, 1: SAME, 3: LOG, 4: SAME})
    assert (variant.axis, variant.first_index) == ("cp", 3)
    assert "at cp 3 run captured rank 3's calls" in variant_line(variant, LAYOUT, why)


def test_three_programs_on_one_axis_or_a_middle_apart_are_refused() -> None:
    other = [("all_gather", "cp", 8, "float32", 0)]
    with pytest.raises(
        TemplateError, match="ranks 0, 1 and 3 of pipeline stage 0 each call differently along cp"
    ):
        variants_of({0: SAME, 1: other, 3: LOG, 4: SAME})
    with pytest.raises(TemplateError, match="ranks between the ends of cp call apart"):
        variants_of({0: SAME, 1: LOG, 3: SAME, 4: SAME})


def test_an_end_that_differs_without_its_axis_second_asks_for_it() -> None:
    with pytest.raises(TemplateError, match=r"capture rank 1 \(cp 1\) too"):
        variants_of({0: LOG, 3: SAME, 4: LOG})


def test_a_captured_rank_that_is_no_axis_probe_must_call_as_the_first() -> None:
    with pytest.raises(TemplateError, match="ranks 0 and 2 both run pipeline stage 0"):
        variants_of({0: SAME, 1: SAME, 2: LOG, 3: SAME, 4: SAME})
