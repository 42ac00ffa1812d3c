"""LayoutTables: each rank's group index and the nodes its groups span, and which dp replicas the
cluster places alike, against ParallelLayout's own per-rank answers."""

from __future__ import annotations

import numpy as np
import pytest

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
