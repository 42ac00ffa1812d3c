"""What a user is told when their program builds a group that is no group of the layout: the
layouts named as matching do have it, and whenever some layout of the world has it one is named."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.capture.layout_check import GroupOutsideLayout, checked_labeler
from prism.schemas.layout import AXES, ParallelLayout
from prism.schemas.layout_match import (
    axes_called,
    matching_layouts,
    nearest_groups,
    outside_layout,
    unused_axis,
)

ORDERS = ["-".join(p) for p in itertools.permutations(AXES)]


@st.composite
def layouts(draw) -> ParallelLayout:
    tp, pp, dp = (draw(st.sampled_from([1, 2, 3, 4])) for _ in AXES)
    return ParallelLayout(tp=tp, pp=pp, dp=dp, order=draw(st.sampled_from(ORDERS)))


def every_group(world: int) -> set[tuple[int, ...]]:
    """Brute force: every group of more than one rank of every layout of ``world`` ranks."""
    groups = set()
    for tp, pp in itertools.product(range(1, world + 1), repeat=2):
        if world % (tp * pp):
            continue
        for order in ORDERS:
            layout = ParallelLayout(tp=tp, pp=pp, dp=world // (tp * pp), order=order)
            groups |= {g for axis in AXES for g in layout.groups(axis) if len(g) > 1}
    return groups


@settings(max_examples=40, deadline=None)
@given(layout=layouts(), other=layouts())
def test_named_layouts_have_the_group_and_one_is_named_when_any_has_it(layout, other) -> None:
    if other.world_size != layout.world_size:
        other = ParallelLayout(tp=1, pp=1, dp=layout.world_size, order=other.order)
    known = every_group(layout.world_size)
    for axis in AXES:
        for group in other.groups(axis):
            if len(group) < 2 or layout.group_of_ranks(group) is not None:
                continue
            matches = matching_layouts(layout, group)
            for match, matched_axis in matches:
                assert match.group_of_ranks(group) == (
                    matched_axis,
                    match.group_index(group[0], matched_axis),
                )
            assert bool(matches) == (group in known)


def test_a_wrong_order_is_named_first() -> None:
    # A (dp, tp) DeviceMesh built tp-fastest, captured with dp fastest.
    layout = ParallelLayout(tp=2, pp=1, dp=4, order="dp-tp-pp")
    line = outside_layout(layout, (0, 2, 4, 6))
    assert (
        "--tp 2 --pp 1 --dp 4 --order tp-dp-pp (its dp group)"
        in line.split("would match:")[1].split(" or ")[0]
    )
    assert [(g.axis, g.ranks) for g in nearest_groups(layout, (0, 2, 4, 6))] == [
        ("dp", (0, 1, 2, 3)),
        ("tp", (0, 4)),
    ]


def test_a_group_no_layout_has_says_so() -> None:
    layout = ParallelLayout(tp=2, pp=2, dp=2)
    assert "no layout of this world and these degrees has it" in outside_layout(layout, (0, 3, 5))


def test_the_capture_stops_at_a_group_outside_the_layout_and_passes_the_layouts_own() -> None:
    label = checked_labeler(ParallelLayout(tp=2, pp=1, dp=4))
    assert label((0, 1)) == "tp.0" and label((1, 3, 5, 7)) == "dp.1" and label(tuple(range(8))) == "world"
    assert label((5,)) == "pp.5"  # pp=1: the degenerate axis holds one rank
    assert checked_labeler(ParallelLayout(tp=2, pp=2, dp=2))((5,)) == "cp.5"  # an axis of degree 1
    assert checked_labeler(ParallelLayout(tp=2, pp=2, dp=2, cp=2, dp_replicate=2, ep=2, etp=2))((5,)) is None
    with pytest.raises(
        GroupOutsideLayout,
        match=r"ranks \[0, 1, 2, 3\] \(4 ranks\).*would match: --tp 2 --pp 1 --dp 4 --order dp-tp-pp",
    ):
        label((0, 1, 2, 3))


def test_a_flattening_of_several_axes_is_a_group_of_the_layout_named_by_its_axes() -> None:
    label = checked_labeler(ParallelLayout(tp=2, pp=2, dp=4))
    assert label(tuple(range(8, 16))) == "dp_tp.1"  # the second stage's dp x tp (torchtitan's loss group)
    assert label((1, 3, 5, 7, 9, 11, 13, 15)) == "pp_dp.1"
    hsdp = checked_labeler(ParallelLayout(tp=1, pp=1, dp=8, dp_replicate=2, cp=2))
    assert hsdp((0, 1, 2, 3, 4, 5, 6, 7)) == "dp_shard_cp.0"  # torchtitan's FSDP group with cp
    assert hsdp((1, 9)) == "dp_replicate.1" and hsdp(tuple(range(0, 16, 2))) == "dp.0"


def test_a_group_outside_a_mesh_names_its_options() -> None:
    layout = ParallelLayout(tp=2, pp=1, dp=4, cp=2, order="dp-tp-cp-pp")
    with pytest.raises(GroupOutsideLayout, match=r"would match: --tp 2 --pp 1 --dp 4 --cp 2 --order tp-"):
        checked_labeler(layout)((0, 1))


def test_an_axis_no_call_spans_is_named() -> None:
    layout = ParallelLayout(tp=2, pp=4, dp=8, dp_replicate=2)
    ddp_only = axes_called(layout, 0, [("all_reduce", "dp.0", None)])
    assert "the layout has pp=4 but the program made no transfer between pipeline stages" in unused_axis(
        layout, ddp_only
    )
    staged = ddp_only | axes_called(layout, 0, [("send", "pp.0", layout.pipeline_next(0))])
    assert "the layout has tp=2 but the program made no call on a group across tp" in unused_axis(
        layout, staged
    )
    assert unused_axis(layout, staged | axes_called(layout, 0, [("all_reduce", "tp.0", None)])) is None
    # A reduction over every rank is across every axis but the pipeline's.
    assert axes_called(layout, 0, [("all_reduce", "world", None)]) == {"tp", "dp_replicate", "dp_shard"}
    # An expert group that is the dp group is labelled dp, and is across ep all the same.
    moe = ParallelLayout(tp=1, pp=1, dp=2, ep=2)
    assert moe.group_of_ranks((0, 1)) == ("dp", 0)
    assert unused_axis(moe, axes_called(moe, 0, [("all_to_all", "dp.0", None)])) is None
    assert "pp=4 but the program made no transfer" in unused_axis(layout, {"tp", "dp_replicate", "dp_shard"})
    hsdp = axes_called(layout, 0, [("all_gather", "dp_shard.0", None)]) | {"tp", "pp"}
    assert unused_axis(layout, hsdp) is None  # dp counts as called across where either part is
    assert axes_called(layout, 0, [("all_reduce", "dp_tp.0", None)]) == {"dp_replicate", "dp_shard", "tp"}


def test_an_hsdp_program_captured_as_plain_fsdp_is_told_its_replicas() -> None:
    with pytest.raises(
        GroupOutsideLayout,
        match=r"would match: --tp 1 --pp 1 --dp 8 --dp-replicate 2 --order tp-dp-pp \(its dp_shard group\)",
    ):
        checked_labeler(ParallelLayout(tp=1, pp=1, dp=8))((0, 1, 2, 3))
