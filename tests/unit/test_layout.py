"""Rank maths of ParallelLayout: coordinates, groups, pipeline neighbours, roles, errors."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prism.schemas.layout import AXES, DEFAULT_ORDER, Coords, LayoutError, ParallelLayout, Role

ORDERS = ["-".join(p) for p in itertools.permutations(AXES)]
MAX_WORLD = 65536
FAST = settings(max_examples=60, deadline=None)


@st.composite
def layouts(draw: st.DrawFn, max_world: int = MAX_WORLD) -> ParallelLayout:
    tp = draw(st.integers(1, 64))
    pp = draw(st.integers(1, min(64, max_world // tp)))
    dp = draw(st.integers(1, max_world // (tp * pp)))
    return ParallelLayout(tp=tp, pp=pp, dp=dp, order=draw(st.sampled_from(ORDERS)))


@st.composite
def layout_and_ranks(draw: st.DrawFn) -> tuple[ParallelLayout, list[int]]:
    """A layout and a sample of its ranks (always including the first and the last)."""
    layout = draw(layouts())
    n = layout.world_size
    return layout, [0, n - 1, *draw(st.lists(st.integers(0, n - 1), max_size=12))]


BIG = ParallelLayout(tp=8, pp=16, dp=512, order="pp-tp-dp")  # 65536 ranks
TARGET = ParallelLayout(tp=8, pp=16, dp=64)  # the design's 8192-GPU job


def sampled(layout: ParallelLayout) -> tuple[ParallelLayout, list[int]]:
    n = layout.world_size
    return layout, sorted({0, 1 % n, n // 3, n // 2, n - 2 if n > 1 else 0, n - 1})


def reference_coords(layout: ParallelLayout, rank: int) -> dict[str, int]:
    """Mixed-radix digits of ``rank``, fastest axis first, computed independently of the class."""
    out = {}
    for axis in layout.order.split("-"):
        rank, out[axis] = divmod(rank, getattr(layout, axis))
    assert rank == 0
    return out


# -- rank <-> coordinates ------------------------------------------------------------------------


@FAST
@given(layout_and_ranks())
@example(sampled(BIG))
@example(sampled(TARGET))
def test_rank_coords_round_trip_every_order(case: tuple[ParallelLayout, list[int]]) -> None:
    layout, ranks = case
    assert layout.world_size <= MAX_WORLD
    for r in ranks:
        c = layout.coords(r)
        assert c == Coords(**reference_coords(layout, r))
        assert layout.rank(tp=c.tp, dp=c.dp, pp=c.pp) == r


@FAST
@given(layouts(), st.data())
def test_coords_to_rank_round_trip(layout: ParallelLayout, data: st.DataObject) -> None:
    idx = {a: data.draw(st.integers(0, layout.degree(a) - 1), label=a) for a in AXES}
    assert layout.coords(layout.rank(**idx)) == Coords(**idx)


def test_megatron_default_order_tp_fastest_then_dp_then_pp() -> None:
    layout = ParallelLayout(tp=2, pp=2, dp=2)
    assert layout.order == DEFAULT_ORDER == "tp-dp-pp"
    assert layout.coords(1) == Coords(tp=1, dp=0, pp=0)
    assert layout.coords(2) == Coords(tp=0, dp=1, pp=0)
    assert layout.coords(3) == Coords(tp=1, dp=1, pp=0)
    assert layout.coords(4) == Coords(tp=0, dp=0, pp=1)
    assert [layout.stride(a) for a in ("tp", "dp", "pp")] == [1, 2, 4]
    assert layout.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert layout.groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # rank = tp_index + tp * (dp_index + dp * pp_index) on an uneven layout
    uneven = ParallelLayout(tp=4, pp=3, dp=5)
    assert uneven.rank(tp=3, dp=2, pp=1) == 3 + 4 * (2 + 5 * 1)


def test_other_order_changes_the_fastest_axis() -> None:
    layout = ParallelLayout(tp=2, pp=3, dp=2, order="pp-tp-dp")
    assert layout.coords(1) == Coords(tp=0, dp=0, pp=1)
    assert layout.coords(3) == Coords(tp=1, dp=0, pp=0)
    assert layout.coords(6) == Coords(tp=0, dp=1, pp=0)
    assert layout.group(0, "pp") == (0, 1, 2)


# -- groups ----------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(layouts(max_world=512))
def test_groups_partition_the_world_with_dense_indices(layout: ParallelLayout) -> None:
    for axis in AXES:
        groups = layout.groups(axis)
        degree = layout.degree(axis)
        assert len(groups) == layout.group_count(axis) == layout.world_size // degree
        assert all(len(g) == degree for g in groups)
        assert sorted(itertools.chain(*groups)) == list(range(layout.world_size))
        for index, g in enumerate(groups):
            for position, member in enumerate(g):
                assert layout.group(member, axis) == g
                assert layout.group_index(member, axis) == index
                assert layout.coords(member).on(axis) == position


@FAST
@given(layout_and_ranks())
@example(sampled(BIG))
def test_group_properties_on_sampled_ranks(case: tuple[ParallelLayout, list[int]]) -> None:
    layout, ranks = case
    for axis in AXES:
        count, degree = layout.group_count(axis), layout.degree(axis)
        for r in ranks:
            g = layout.group(r, axis)
            c = layout.coords(r)
            assert len(g) == degree and g[c.on(axis)] == r
            index = layout.group_index(r, axis)
            assert 0 <= index < count
            for position in {
                0,
                1 % degree,
                degree // 2,
                degree - 1,
                c.on(axis),
            }:  # sample: degree may be 65536
                member = g[position]
                mc = layout.coords(member)
                assert mc.on(axis) == position
                assert all(mc.on(o) == c.on(o) for o in AXES if o != axis)
                assert layout.group(member, axis) == g
                assert layout.group_index(member, axis) == index
        # group_index is injective: equal indices exactly when the groups are equal
        for r1, r2 in itertools.combinations(ranks, 2):
            same_group = layout.group(r1, axis) == layout.group(r2, axis)
            assert (layout.group_index(r1, axis) == layout.group_index(r2, axis)) == same_group


@FAST
@given(layout_and_ranks())
@example(sampled(BIG))
def test_group_of_ranks_inverts_group(case: tuple[ParallelLayout, list[int]]) -> None:
    layout, ranks = case
    world = tuple(range(layout.world_size))
    for r in ranks:
        for axis in AXES:
            g = layout.group(r, axis)
            label = layout.group_of_ranks(g)
            assert layout.group_of_ranks(list(g)) == label
            # degree-1 axes all match a single rank: the first of tp, dp, pp wins
            first = next(a for a in AXES if layout.degree(a) == len(g) and layout.group(r, a) == g)
            assert label == (first, layout.group_index(r, first))
            if layout.degree(axis) > 1:
                assert first == axis
                assert layout.group_of_ranks(g[::-1]) is None
                assert (
                    layout.group_of_ranks(g[:-1] if len(g) > 2 else g + ((g[-1] + 1) % len(world),)) is None
                )


def test_whole_world_is_labelled_by_the_axis_that_spans_it() -> None:
    assert ParallelLayout(tp=1, pp=1, dp=2).group_of_ranks((0, 1)) == ("dp", 0)
    assert ParallelLayout(tp=2, pp=1, dp=1).group_of_ranks((0, 1)) == ("tp", 0)
    assert ParallelLayout(tp=2, pp=2, dp=1).group_of_ranks((0, 1, 2, 3)) == ("world", 0)


def test_group_of_ranks_rejects_non_groups() -> None:
    layout = ParallelLayout(tp=2, pp=2, dp=2)
    assert layout.group_of_ranks(()) is None
    assert layout.group_of_ranks((1, 0)) is None  # right members, wrong order
    assert layout.group_of_ranks((1, 2)) is None
    assert layout.group_of_ranks((0, 1, 2)) is None
    assert layout.group_of_ranks((0, 3)) is None
    assert layout.group_of_ranks(tuple(range(8))) == ("world", 0)
    assert layout.group_of_ranks((2, 3)) == ("tp", 1)
    assert layout.group_of_ranks((1, 3)) == ("dp", 1)
    assert layout.group_of_ranks((3, 7)) == ("pp", 3)


# -- pipeline and roles ----------------------------------------------------------------------------


@FAST
@given(layout_and_ranks())
@example(sampled(BIG))
def test_pipeline_neighbours_are_inverse_and_keep_tp_dp(case: tuple[ParallelLayout, list[int]]) -> None:
    layout, ranks = case
    for r in ranks:
        c = layout.coords(r)
        assert layout.stage(r) == c.pp
        nxt, prev = layout.pipeline_next(r), layout.pipeline_prev(r)
        if c.pp == layout.pp - 1:
            assert nxt is None
        else:
            assert layout.coords(nxt) == Coords(tp=c.tp, dp=c.dp, pp=c.pp + 1)
            assert layout.pipeline_prev(nxt) == r
        if c.pp == 0:
            assert prev is None
        else:
            assert layout.coords(prev) == Coords(tp=c.tp, dp=c.dp, pp=c.pp - 1)
            assert layout.pipeline_next(prev) == r


@FAST
@given(layout_and_ranks())
def test_roles_and_representatives(case: tuple[ParallelLayout, list[int]]) -> None:
    layout, ranks = case
    pp = layout.pp
    roles = layout.roles()
    if pp == 1:
        expected = {Role.SINGLE: 0}
    elif pp == 2:
        expected = {Role.FIRST: 0, Role.LAST: 1}
    else:
        expected = {Role.FIRST: 0, Role.MIDDLE: 1, Role.LAST: pp - 1}
    assert {role: layout.stage(rep) for role, rep in roles.items()} == expected
    for role, rep in roles.items():
        c = layout.coords(rep)
        assert (c.tp, c.dp) == (0, 0)
        assert layout.role(rep) == role
    for r in ranks:
        stage = layout.stage(r)
        want = (
            Role.SINGLE
            if pp == 1
            else Role.FIRST
            if stage == 0
            else Role.LAST
            if stage == pp - 1
            else Role.MIDDLE
        )
        assert layout.role(r) == want == layout.role_of_stage(stage)


def test_roles_explicit() -> None:
    assert ParallelLayout(tp=2, pp=1, dp=2).roles() == {Role.SINGLE: 0}
    assert ParallelLayout(tp=2, pp=2, dp=2).roles() == {Role.FIRST: 0, Role.LAST: 4}
    assert ParallelLayout(tp=2, pp=4, dp=2).roles() == {Role.FIRST: 0, Role.MIDDLE: 4, Role.LAST: 12}
    assert [ParallelLayout(tp=1, pp=4, dp=1).role(r) for r in range(4)] == [
        Role.FIRST,
        Role.MIDDLE,
        Role.MIDDLE,
        Role.LAST,
    ]


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("bad", [0, -1, -8, True, False, 2.0, "2", None])
def test_bad_degree_is_rejected_and_named(axis: str, bad: object) -> None:
    degrees = {"tp": 2, "pp": 2, "dp": 2, axis: bad}
    with pytest.raises(LayoutError, match=rf"^{axis} must be a positive integer"):
        ParallelLayout(**degrees)


@pytest.mark.parametrize(
    "order",
    ["", "tp-dp", "tp-dp-pp-tp", "tp-tp-pp", "TP-DP-PP", "tp,dp,pp", "tp-dp-ep", "tp--dp-pp", "tp-dp-pp-"],
)
def test_bad_order_is_rejected(order: str) -> None:
    with pytest.raises(LayoutError, match="order must be a permutation"):
        ParallelLayout(tp=2, pp=2, dp=2, order=order)


def test_layout_error_is_a_value_error() -> None:
    assert issubclass(LayoutError, ValueError)


def test_out_of_range_ranks_and_indices() -> None:
    layout = ParallelLayout(tp=2, pp=3, dp=4)
    n = layout.world_size
    calls = [
        lambda: layout.coords(-1),
        lambda: layout.coords(n),
        lambda: layout.group(n, "tp"),
        lambda: layout.group_index(-1, "dp"),
        lambda: layout.pipeline_next(n),
        lambda: layout.pipeline_prev(-1),
        lambda: layout.role(n),
        lambda: layout.role_of_stage(3),
        lambda: layout.role_of_stage(-1),
        lambda: layout.rank(tp=2, dp=0, pp=0),
        lambda: layout.rank(tp=0, dp=4, pp=0),
        lambda: layout.rank(tp=0, dp=0, pp=3),
        lambda: layout.rank(tp=-1, dp=0, pp=0),
    ]
    for call in calls:
        with pytest.raises(LayoutError, match="out of range"):
            call()


@pytest.mark.parametrize("method", ["degree", "stride", "group_count", "groups"])
def test_unknown_axis_is_rejected(method: str) -> None:
    with pytest.raises(LayoutError, match="'xp' names no group kind"):
        getattr(ParallelLayout(tp=2, pp=2, dp=2), method)("xp")


@pytest.mark.parametrize("method", ["group_index", "group"])
def test_unknown_axis_is_rejected_by_rank_methods(method: str) -> None:
    with pytest.raises(LayoutError, match="names no group kind"):
        getattr(ParallelLayout(tp=2, pp=2, dp=2), method)(0, "xp")


# -- serialisation ---------------------------------------------------------------------------------


@FAST
@given(layouts())
def test_to_dict_from_dict_round_trip(layout: ParallelLayout) -> None:
    data = layout.to_dict()
    assert data == {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "order": layout.order}
    assert ParallelLayout.from_dict(json.loads(json.dumps(data))) == layout


def test_from_dict_defaults_order_and_validates() -> None:
    assert ParallelLayout.from_dict({"tp": 2, "pp": 3, "dp": 4}).order == DEFAULT_ORDER
    with pytest.raises(LayoutError):
        ParallelLayout.from_dict({"tp": 0, "pp": 1, "dp": 1})
    with pytest.raises(LayoutError):
        ParallelLayout.from_dict({"tp": 1, "pp": 1, "dp": 1, "order": "dp-tp"})


@pytest.mark.parametrize("bad", [2.5, True])
def test_from_dict_rejects_non_integer_degrees(bad: object) -> None:
    with pytest.raises(LayoutError):
        ParallelLayout.from_dict({"tp": bad, "pp": 1, "dp": 1})


@FAST
@given(layout_and_ranks())
@example(sampled(BIG))
def test_a_ranks_pipeline_is_its_pp_group(case: tuple[ParallelLayout, list[int]]) -> None:
    layout, ranks = case
    for r in ranks:
        pipeline = [layout.in_pipeline(r, s) for s in range(layout.pp)]
        assert tuple(pipeline) == layout.group(r, "pp")
        assert [layout.stage(p) for p in pipeline] == list(range(layout.pp))
        assert all(layout.same_pipeline(r, p) for p in pipeline)
        assert not any(layout.same_pipeline(r, q) for q in ranks if q not in pipeline)
