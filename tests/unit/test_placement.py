"""LayoutTables: each rank's group index and the nodes its groups span, and which dp replicas the
cluster places alike, against ParallelLayout's own per-rank answers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.graph.comm.placement import LayoutTables
from prism.schemas.layout import ParallelLayout

LAYOUTS = [
    (tp, pp, dp, order, gpus)
    for order in ("tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp")
    for tp, pp, dp, gpus in ((8, 4, 4, 8), (2, 2, 2, 1), (3, 2, 4, 8), (2, 4, 6, 3), (4, 3, 5, 6))
]


@pytest.mark.parametrize(("tp", "pp", "dp", "order", "gpus"), LAYOUTS)
def test_group_indices_and_spans_are_the_layouts(tp: int, pp: int, dp: int, order: str, gpus: int) -> None:
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, order=order)
    tables = LayoutTables.build(layout, gpus)
    for rank in range(layout.world_size):
        for axis in ("tp", "dp", "pp"):
            assert tables.group_index[axis][rank] == layout.group_index(rank, axis)
            nodes = {member // gpus for member in layout.group(rank, axis)}
            assert tables.nodes_spanned[axis][rank] == len(nodes)


@pytest.mark.parametrize(("tp", "pp", "dp", "order", "gpus"), LAYOUTS)
def test_replicas_fold_only_where_placed_alike(tp: int, pp: int, dp: int, order: str, gpus: int) -> None:
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, order=order)
    tables = LayoutTables.build(layout, gpus)
    replica_of = tables.replica_of()
    assert (replica_of[replica_of] == replica_of).all() and (replica_of <= np.arange(dp)).all()

    def placement(replica: int) -> list[tuple]:  # what the comm model prices, position by position
        out = []
        for rank in sorted(r for r in range(layout.world_size) if layout.coords(r).dp == replica):
            c = layout.coords(rank)
            spans = tuple(len({m // gpus for m in layout.group(rank, a)}) for a in ("tp", "dp", "pp"))
            neighbours = tuple(
                layout.rank(tp=c.tp, dp=c.dp, pp=c.pp + step) // gpus != rank // gpus
                for step in (1, -1)
                if 0 <= c.pp + step < pp
            )
            out.append((spans, c.pp, neighbours))
        return out

    for d in range(dp):
        assert placement(d) == placement(int(replica_of[d]))
        assert all(placement(d) != placement(e) for e in set(replica_of[:d].tolist()) - {replica_of[d]})


EXPERT_LAYOUTS = [
    (ParallelLayout(tp=1, pp=1, dp=16, ep=8), 4),
    (ParallelLayout(tp=1, pp=1, dp=12, ep=6), 4),  # groups cut by node boundaries unevenly
    (ParallelLayout(tp=2, pp=2, dp=8, ep=4), 4),
    (ParallelLayout(tp=1, pp=1, dp=8, dp_replicate=2, cp=2, ep=8), 2),
]


def _brute_force_volumes(layout: ParallelLayout, rank: int, relative: list[int], gpus: int) -> list[float]:
    """Every member routing as ``rank`` does from its own place: the most any member sends or
    receives on its node, and off it."""
    members = layout.group(rank, "ep")
    p = len(members)
    sent = {
        (a, b): relative[(j - i) % p] for i, a in enumerate(members) for j, b in enumerate(members) if a != b
    }
    on, off = [], []
    for m in members:
        for pairs in ([(m, b) for b in members if b != m], [(a, m) for a in members if a != m]):
            on.append(sum(sent[x] for x in pairs if x[0] // gpus == x[1] // gpus))
            off.append(sum(sent[x] for x in pairs if x[0] // gpus != x[1] // gpus))
    return [max(on), max(off)]


@pytest.mark.parametrize(("layout", "gpus"), EXPERT_LAYOUTS, ids=str)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_an_all_to_alls_volumes_are_its_busiest_members(layout: ParallelLayout, gpus: int, data) -> None:
    tables = LayoutTables.build(layout, gpus)
    p = layout.degree("ep")
    rank = data.draw(st.integers(0, layout.world_size - 1))
    relative = data.draw(st.lists(st.integers(0, 10_000), min_size=p, max_size=p))
    rows = np.array([rank])
    got = tables.all_to_all_volumes("ep", rows, np.array([relative]))
    assert got[0].tolist() == _brute_force_volumes(layout, rank, relative, gpus)
    # In group order: the member d places after the rank gets item d; and back.
    members = layout.group(rank, "ep")
    splits = tables.absolute_splits("ep", rows, np.array([relative]))
    position = members.index(rank)
    assert splits[0].tolist() == [relative[(j - position) % p] for j in range(p)]
    assert tables.relative_splits("ep", rows, splits)[0].tolist() == relative
