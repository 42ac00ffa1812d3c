"""The N-dimensional layout: every group kind's groups against brute force, and the groups
torchtitan's and Megatron's meshes build are the layout's, labelled by their axes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.graph.comm.placement import LayoutTables
from prism.schemas.group_kinds import DENSE_AXES, EXPERT_AXES, KindError, axes_of, name_of
from prism.schemas.layout import ORDER_AXES, LayoutError, ParallelLayout

SMALL = [1, 2, 3]


@st.composite
def meshes(draw: st.DrawFn) -> ParallelLayout:
    tp, pp, cp, dp_replicate, dp_shard = (draw(st.sampled_from(SMALL)) for _ in range(5))
    region = dp_shard * cp * tp
    ep = draw(st.sampled_from([d for d in range(1, region + 1) if region % d == 0]))
    etp = draw(st.sampled_from([d for d in range(1, region // ep + 1) if region // ep % d == 0]))
    order = "-".join(draw(st.permutations(ORDER_AXES)))
    return ParallelLayout(tp=tp, pp=pp, dp=dp_replicate * dp_shard, cp=cp, dp_replicate=dp_replicate, ep=ep,
                          etp=etp, order=order)  # fmt: skip


def reference_coords(layout: ParallelLayout) -> list[dict[str, int]]:
    """Every rank's index on every axis: mixed-radix digits in the order (dp as dp_shard then
    dp_replicate), the expert axes from the region's ranks numbered in the same order."""
    order = layout.order.split("-")
    if "cp" not in order:
        order.insert(order.index("dp"), "cp")
    digits = []
    for axis in order:
        digits += [("dp_shard", layout.dp_shard), ("dp_replicate", layout.dp_replicate)] if axis == "dp" else [
            (axis, layout.degree(axis))]  # fmt: skip
    region_digits = [(a, n) for a, n in digits if a in ("dp_shard", "cp", "tp")]
    out = []
    for rank in range(layout.world_size):
        coords, rest = {}, rank
        for axis, size in digits:
            rest, coords[axis] = divmod(rest, size)
        region, scale = 0, 1
        for axis, size in region_digits:
            region, scale = region + coords[axis] * scale, scale * size
        coords["etp"], rest = region % layout.etp, region // layout.etp
        coords["ep"], coords["edp"] = rest % layout.ep, rest // layout.ep
        out.append(coords)
    return out


def kinds_to_check(layout: ParallelLayout) -> list[tuple[str, ...]]:
    return [axes for system in (DENSE_AXES, EXPERT_AXES) for n in range(1, 4)
            for axes in itertools.combinations(system, n)]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(meshes())
def test_every_kinds_groups_are_the_brute_force_ones(layout: ParallelLayout) -> None:
    coords = reference_coords(layout)
    for r in range(layout.world_size):
        assert layout.fine_coords(r) == coords[r]
    for axes in kinds_to_check(layout):
        kind = name_of(axes)
        system = DENSE_AXES if all(a in DENSE_AXES for a in axes) else EXPERT_AXES
        held = [a for a in system if a not in axes]
        indices: dict[int, tuple[int, ...]] = {}
        for r in range(layout.world_size):
            expected = tuple(
                s for s in range(layout.world_size) if all(coords[s][a] == coords[r][a] for a in held)
            )
            group = layout.group(r, kind)
            assert group == expected, (kind, r)
            assert indices.setdefault(layout.group_index(r, kind), group) == group  # one index, one group
        assert sorted(indices) == list(range(layout.group_count(kind)))
        assert [tuple(g) for g in layout.groups(kind)] == [indices[i] for i in sorted(indices)]


@settings(max_examples=60, deadline=None)
@given(meshes())
def test_every_group_of_every_kind_is_labelled_as_a_kind_with_that_group(layout: ParallelLayout) -> None:
    kinds = layout.kinds()
    assert len({layout.group(0, k) for k in kinds if layout.degree(k) < layout.world_size}) == len(
        [k for k in kinds if layout.degree(k) < layout.world_size]
    )  # no kind twice
    for axes in kinds_to_check(layout):
        for group in layout.groups(name_of(axes)):
            if len(group) < 2:
                continue
            kind, index = layout.group_of_ranks(group)
            assert kind in kinds
            assert (
                layout.group(group[0], kind) if kind != "world" else tuple(range(layout.world_size))
            ) == group
            assert kind == "world" or layout.group_index(group[0], kind) == index


def dense_mesh(layout: ParallelLayout) -> np.ndarray:
    """torchtitan's dense mesh, (pp, dp_replicate, dp_shard, cp, tp), over the world in rank order."""
    return np.arange(layout.world_size).reshape(
        layout.pp, layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp
    )


def mesh_groups(mesh: np.ndarray, dims: tuple[int, ...]) -> set[tuple[int, ...]]:
    """The groups DeviceMesh builds for ``dims`` (flattened when several): ranks varying on them."""
    moved = np.moveaxis(mesh, dims, tuple(range(mesh.ndim - len(dims), mesh.ndim)))
    return {
        tuple(sorted(row)) for row in moved.reshape(-1, int(np.prod([mesh.shape[d] for d in dims]))).tolist()
    }


TITAN = [
    ParallelLayout(tp=2, pp=2, dp=8, dp_replicate=2, cp=2, ep=4, order="tp-cp-dp-pp"),
    ParallelLayout(tp=2, pp=1, dp=4, cp=2, ep=8),
    ParallelLayout(tp=1, pp=2, dp=8, dp_replicate=4, ep=2),
]


@pytest.mark.parametrize("layout", TITAN, ids=str)
def test_torchtitans_meshes_are_the_layouts_groups(layout: ParallelLayout) -> None:
    """Every group torchtitan's ParallelDims builds (its dense, data-loading, loss and sparse meshes,
    any axes flattened) is a group of the layout, labelled by the axes it spans."""
    dense = dense_mesh(layout)
    names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    for n in range(1, 4):
        for dims in itertools.combinations(range(5), n):
            axes = tuple(names[d] for d in dims if dense.shape[d] > 1)
            for group in mesh_groups(dense, dims):
                if len(group) > 1:
                    kind, _ = layout.group_of_ranks(group)
                    if kind == "world":
                        assert len(group) == layout.world_size
                        continue
                    assert layout.group(group[0], kind) == group
                    spans = set(axes_of(kind))
                    if not spans & {"edp", "ep", "etp"}:  # an expert kind may be the same ranks
                        assert {a for a in spans if layout.degree(a) > 1} == set(axes)
    # The sparse mesh: (pp, dp_replicate, efsdp, ep), efsdp x ep = dp_shard x cp x tp.
    sparse = np.arange(layout.world_size).reshape(layout.pp, layout.dp_replicate, layout.edp, layout.ep)
    for dims, kind in (((3,), "ep"), ((2,), "edp"), ((1, 2), "dp_replicate_edp")):
        expected = {g for g in mesh_groups(sparse, dims)}
        assert {layout.group(r, kind) for r in range(layout.world_size)} == expected


def test_megatrons_expert_groups_are_the_layouts() -> None:
    """Megatron's expert rank order tp-ep-dp-pp over (etp, ep, edp, pp) gives the expert groups."""
    layout = ParallelLayout(tp=4, pp=2, dp=4, cp=2, ep=4, etp=2)
    world = np.arange(layout.world_size).reshape(layout.pp, layout.edp, layout.ep, layout.etp)
    for dims, kind in (((3,), "etp"), ((2,), "ep"), ((1,), "edp"), ((2, 3), "ep_etp")):
        assert {layout.group(r, kind) for r in range(layout.world_size)} == mesh_groups(world, dims)


def test_kind_names_are_the_frameworks() -> None:
    assert name_of(("cp", "dp_shard")) == "dp_shard_cp"  # torchtitan's FSDP group with context parallel
    assert name_of(("dp_replicate", "dp_shard", "cp")) == "dp_cp"  # Megatron's
    assert axes_of("dp") == ("dp_replicate", "dp_shard")
    assert axes_of("dp_replicate_edp") == ("dp_replicate", "edp")
    for bad, why in (("xp", "names no group kind"), ("cp_dp", "is written 'dp_cp'"), ("ep_cp", "mix dense and expert"),
                     ("dp_dp_shard", "twice")):  # fmt: skip
        with pytest.raises(KindError, match=why):
            axes_of(bad)


def test_three_axis_layouts_read_and_write_as_before() -> None:
    old = ParallelLayout(tp=8, pp=16, dp=64)
    assert old.to_dict() == {"tp": 8, "pp": 16, "dp": 64, "order": "tp-dp-pp"}
    assert str(old) == "tp=8 pp=16 dp=64 (tp-dp-pp, 8192 ranks)"
    assert ParallelLayout(tp=8, pp=16, dp=64, order="tp-cp-dp-pp") == old  # cp = 1: where it sits is moot
    new = ParallelLayout(tp=2, pp=2, dp=8, dp_replicate=2, cp=2, ep=4)
    assert new.order == "tp-cp-dp-pp" and new.world_size == 64 and new.dp_shard == 4 and new.edp == 4
    assert ParallelLayout.from_dict(new.to_dict()) == new
    assert str(new) == "tp=2 pp=2 dp=8 dp_replicate=2 dp_shard=4 cp=2 ep=4 (tp-cp-dp-pp, 64 ranks)"
    with pytest.raises(LayoutError, match="which this prism does not know"):
        ParallelLayout.from_dict({**new.to_dict(), "sp": 2})


@pytest.mark.parametrize(
    ("degrees", "why"),
    [
        ({"dp": 6, "dp_replicate": 4}, "does not divide dp=6"),
        ({"dp": 2, "ep": 3}, "ep x etp = 3 does not divide dp_shard x cp x tp = 4"),
        ({"dp": 2, "cp": 0}, "cp must be a positive integer"),
        ({"dp": 2, "order": "tp-dp-cp"}, "permutation of tp, dp, pp"),
    ],
)
def test_impossible_meshes_are_refused(degrees: dict, why: str) -> None:
    with pytest.raises(LayoutError, match=why):
        ParallelLayout(**{"tp": 2, "pp": 1, **degrees})


def test_the_comm_model_sees_where_each_kinds_groups_sit() -> None:
    """HSDP at 8 replicas x 1,024 shards on 8-GPU nodes: a replica group's 8 ranks on 8 nodes, a
    shard group's 1,024 on 128; the replicas, along dp_replicate, sit alike."""
    layout = ParallelLayout(tp=1, pp=1, dp=8192, dp_replicate=8)
    tables = LayoutTables.build(layout, gpus_per_node=8)
    assert set(tables.nodes_spanned["dp_replicate"]) == {8} and set(tables.nodes_spanned["dp_shard"]) == {128}
    assert tables.group_index["dp_shard"][1027] == 1 and tables.group_index["dp_replicate"][1027] == 3
    assert list(tables.replica_of()) == [0] * 8  # its replicas sit alike: one simulated for all
    moe = ParallelLayout(tp=2, pp=1, dp=8, ep=4, cp=2)
    tables = LayoutTables.build(moe, gpus_per_node=8)
    for kind in moe.kinds():
        if kind != "world":
            assert [tables.group_index[kind][r] for r in range(moe.world_size)] == [
                moe.group_index(r, kind) for r in range(moe.world_size)
            ]


@settings(max_examples=300, deadline=None)
@given(meshes())
def test_a_fold_axis_cuts_the_world_into_replicas_every_group_lies_in_or_spans_alike(
    layout: ParallelLayout,
) -> None:
    """What folding alike replicas rests on: each group inside one replica, or with as many
    members in every replica; the fold axis's index is the rank's own on that axis."""
    axis = layout.fold_axis
    if axis is None:
        return
    ranks = np.arange(layout.world_size)
    replica = (ranks // layout.stride(axis)) % layout.degree(axis)
    if axis == "edp":
        assert replica.tolist() == [c["edp"] for c in reference_coords(layout)]
    for kind in layout.kinds():
        for group in layout.groups(kind):
            counts = np.bincount(replica[list(group)], minlength=layout.degree(axis))
            inside = np.count_nonzero(counts) == 1
            assert inside or (counts == counts[0]).all(), (kind, group, counts.tolist())


def test_expert_parallel_without_hsdp_folds_along_its_expert_data_parallel_index() -> None:
    # torchtitan's order, ep over dp_shard x cp: blocks of 8 consecutive ranks, one per edp index.
    layout = ParallelLayout(tp=1, pp=1, dp=512, cp=2, ep=8, order="tp-cp-dp-pp")
    assert (layout.fold_axis, layout.stride("edp"), layout.degree("edp")) == ("edp", 8, 128)
    # A tensor-parallel group of 4 cut by ep 2 spans two blocks of the 16: nothing folds.
    assert ParallelLayout(tp=4, pp=1, dp=8, ep=2).fold_axis is None
    # Pipeline stages between tp and dp in the rank order: a block is no stride of ranks.
    assert ParallelLayout(tp=2, pp=2, dp=8, ep=4, order="tp-pp-dp").fold_axis is None


@settings(max_examples=60, deadline=None)
@given(meshes())
def test_a_ranks_place_on_one_axis_is_the_brute_force_one(layout: ParallelLayout) -> None:
    # rank_on_axis(stage, axis, i): of the stage's ranks, the one at i on the axis and at 0 on
    # every other axis of its system; axis_ends: the last such rank of each axis of > 1 rank,
    # axis_seconds: the one at 1 of each axis of > 2.
    for stage in {0, layout.pp - 1}:
        for axis in layout.stage_axes():
            system = EXPERT_AXES if axis in ("edp", "ep", "etp") else DENSE_AXES
            for index in range(layout.degree(axis)):
                found = [
                    r
                    for r in range(layout.world_size)
                    if all(layout.fine_coords(r)[a] == {"pp": stage, axis: index}.get(a, 0) for a in system)
                ]
                assert found == [layout.rank_on_axis(stage, axis, index)]
        ends, seconds = layout.axis_ends(stage), layout.axis_seconds(stage)
        assert set(ends) == {a for a in layout.stage_axes() if layout.degree(a) > 1}
        assert all(layout.fine_coords(r)[a] == layout.degree(a) - 1 for a, r in ends.items())
        assert set(seconds) == {a for a in layout.stage_axes() if layout.degree(a) > 2}
        assert all(seconds[a] == layout.rank_on_axis(stage, a, 1) for a in seconds)
    with pytest.raises(LayoutError, match="not an axis within a pipeline stage"):
        layout.rank_on_axis(0, "pp", 0)


def test_axis_ends_captures_each_stages_first_rank_and_its_second_and_last_on_every_axis() -> None:
    from prism.capture.runner import ProgramRoles, program_ranks

    layout = ParallelLayout(tp=2, pp=2, dp=4, cp=2, ep=4)
    assert program_ranks(layout, ProgramRoles.PIPELINE) == (0, layout.rank(tp=0, dp=0, pp=1))
    ranks = program_ranks(layout, ProgramRoles.AXIS_ENDS)
    assert len(ranks) == len(set(ranks))  # dp_shard's end can be edp's: captured once
    for stage in (0, 1):
        first = layout.rank(tp=0, dp=0, pp=stage)
        probes = {*layout.axis_seconds(stage).values(), *layout.axis_ends(stage).values()}
        assert {first, *probes} == {r for r in ranks if layout.stage(r) == stage}
