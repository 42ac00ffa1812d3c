"""The layout a traced job's collective groups fit, and the ids of their instances."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from prism.graph.build.trace_groups import CollectiveIds, GroupError, infer_layout, number_in_groups
from prism.schemas.layout import ParallelLayout


@pytest.mark.parametrize(
    ("groups", "world", "tp"),
    [
        ({tuple(range(8))}, 8, 1),  # data parallel over the world
        ({(0, 1), (2, 3)}, 8, 2),  # tensor-parallel pairs
        ({(0, 4)}, 8, 4),  # data-parallel pairs of a tp=4 job
        ({(0, 1), (0, 2)}, 4, 2),  # a tp group and a dp group of one rank
        ({(0, 1, 2, 3), (0, 4)}, 8, 4),
        ({(0, 1), tuple(range(8))}, 8, 2),  # tensor parallel, and a collective over the world
        (set(), 6, 1),  # no collective at all
    ],
)
def test_the_smallest_tensor_parallel_degree_that_fits_every_group(groups: set, world: int, tp: int) -> None:
    assert infer_layout(groups, world) == ParallelLayout(tp=tp, pp=1, dp=world // tp)


def test_groups_no_layout_has_are_named() -> None:
    with pytest.raises(GroupError, match=r"ranks \[0, 3\] fit no layout of 4 ranks"):
        infer_layout({(0, 1), (0, 3)}, 4)
    # Each fits a layout, but not the same one: tp pairs and tp quadruples.
    with pytest.raises(GroupError, match=r"groups \(\[0, 1\], \[0, 1, 2, 3\]\) fit no one layout of 8"):
        infer_layout({(0, 1), (0, 1, 2, 3)}, 8)


def test_every_instance_of_every_group_has_an_id_of_its_own() -> None:
    layout = ParallelLayout(tp=2, pp=1, dp=3)
    ids = CollectiveIds(layout)
    seen = {}
    for kind, n in itertools.product(("world", "tp", "dp"), range(5)):
        groups = 1 if kind == "world" else layout.group_count(kind)
        for index in range(groups):
            cid = int(ids.coll_id(np.array([kind]), np.array([index]), np.array([n]))[0])
            assert cid not in seen, (kind, index, n, seen.get(cid))
            seen[cid] = (kind, index, n)
            assert ids.n_of(np.array([cid]))[0] == n
    # A rank's own group of each kind, and nothing for a node that is no collective.
    assert ids.group_index(3, np.array(["tp", "dp", "world", ""])).tolist() == [1, 1, 0, -1]
    assert ids.coll_id(np.array([""]), np.array([-1]), np.array([-1])).tolist() == [-1]


def test_collectives_are_numbered_within_their_group_in_the_order_they_ran() -> None:
    kinds = np.array(["tp", "", "dp", "tp", "dp", "tp"])
    order = np.array([0, -1, 2, 1, 4, 3])
    assert number_in_groups(kinds, order).tolist() == [0, -1, 0, 1, 1, 2]
