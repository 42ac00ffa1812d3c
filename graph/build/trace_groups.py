"""The groups a traced job's collectives ran on: the layout they fit, and each instance's id.

Traces name each collective's members (``record_param_comms``' ``Process Group Ranks``), not
the job's layout. The layout is the one whose tensor-parallel, data-parallel or whole-world
groups are exactly the groups the traces' collectives ran on: data parallel over the world when
every collective spans it, else the smallest tensor-parallel degree that fits them all (tp
groups are runs of consecutive ranks, dp groups ranks ``tp`` apart). Pipeline stages are not
inferred (pp = 1): a job of several stages makes its transfers point to point.

A collective instance is the n-th collective of one group in the step: ``CollectiveIds`` gives
it an id unique in the graph, the same for every member, so that a rank without a trace, which
takes a traced rank's rows, joins its own groups' instances.
"""

from __future__ import annotations

import numpy as np

from prism.schemas.layout import ParallelLayout

WORLD = "world"
KINDS = ("world", "tp", "dp")
"""The group kinds a traced collective may have, in the order of their ids."""


class GroupError(ValueError):
    """Collectives whose groups no layout has; the message is one line for the user."""


def infer_layout(groups: set[tuple[int, ...]], world: int) -> ParallelLayout:
    """The layout whose tp, dp or world groups are exactly ``groups`` (sorted member tuples)."""
    layouts = [ParallelLayout(tp=tp, pp=1, dp=world // tp) for tp in range(1, world + 1) if world % tp == 0]
    for layout in layouts:
        if all(_kind_of(layout, g) is not None for g in groups):
            return layout
    taken = "graphs from traces take tensor-parallel, data-parallel and whole-world groups"
    alone = [g for g in sorted(groups) if all(_kind_of(layout, g) is None for layout in layouts)]
    if alone:
        raise GroupError(f"collectives over ranks {list(alone[0])} fit no layout of {world} ranks ({taken})")
    shown = ", ".join(str(list(g)) for g in sorted(groups)[:4]) + (", ..." if len(groups) > 4 else "")
    raise GroupError(
        f"the collectives' groups ({shown}) fit no one layout of {world} ranks together ({taken})"
    )


def _kind_of(layout: ParallelLayout, members: tuple[int, ...]) -> str | None:
    found = layout.group_of_ranks(members)
    if found is None or found[0] not in KINDS:
        return None
    return found[0]


def group_kind(layout: ParallelLayout, members: tuple[int, ...]) -> str:
    """tp, dp or world: the kind of the group ``members`` are in ``layout``."""
    kind = _kind_of(layout, members)
    if kind is None:
        raise GroupError(f"ranks {list(members)} are no group of the layout {layout}")
    return kind


class CollectiveIds:
    """Ids of collective instances: the n-th collective of the group of kind k and index i is
    ``n * span + key(k, i)``, one key per group of the layout."""

    def __init__(self, layout: ParallelLayout) -> None:
        self.layout = layout
        self._base = {WORLD: 0, "tp": 1, "dp": 1 + layout.group_count("tp")}
        self.span = 1 + layout.group_count("tp") + layout.group_count("dp")

    def index_of(self, rank: int, kind: str) -> int:
        """Index of ``rank``'s group of ``kind`` among that kind's groups (0 for the world)."""
        return 0 if kind == WORLD else self.layout.group_index(rank, kind)

    def key(self, kind: str, index: int) -> int:
        """The id of the first instance of group ``index`` of ``kind`` (the n-th adds n * span)."""
        return self._base[kind] + index

    def group_index(self, rank: int, kinds: np.ndarray) -> np.ndarray:
        """Index of ``rank``'s group of each kind (0 for the world; -1 where the kind is "")."""
        index = {k: self.index_of(rank, k) for k in KINDS}
        return np.array([index.get(k, -1) for k in kinds], np.int32)

    def group_size(self, kinds: np.ndarray) -> np.ndarray:
        size = {WORLD: self.layout.world_size, "tp": self.layout.tp, "dp": self.layout.dp}
        return np.array([size.get(k, 0) for k in kinds], np.int32)

    def coll_id(self, kinds: np.ndarray, index: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Each node's instance id (-1 where the kind is "": not a collective)."""
        base = np.array([self._base.get(k, -1) for k in kinds], np.int64)
        return np.where(base >= 0, n * self.span + base + index, -1)

    def n_of(self, coll_id: np.ndarray) -> np.ndarray:
        """The n (within its group) of each instance id (-1 for -1)."""
        return np.where(coll_id >= 0, coll_id // self.span, -1)


def number_in_groups(kinds: np.ndarray, order: np.ndarray) -> np.ndarray:
    """For collective nodes (kind not ""), their n within their kind's group, by ``order`` (the
    step's n-th collective, as the GPU ran them); -1 elsewhere. One rank is in one group of
    each kind, so counting by kind counts by group."""
    n = np.full(len(kinds), -1, np.int64)
    for kind in KINDS:
        nodes = np.flatnonzero(kinds == kind)
        n[nodes[np.argsort(order[nodes], kind="stable")]] = np.arange(len(nodes))
    return n
