"""Where the target layout's groups sit on the cluster's nodes: the comm model's per-rank inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prism.schemas.group_kinds import WORLD
from prism.schemas.layout import ParallelLayout
from prism.schemas.layout_arrays import fine_coords, group_indices


@dataclass(frozen=True)
class LayoutTables:
    """Per-rank facts of the target layout, as arrays indexed by global rank."""

    layout: ParallelLayout
    group_index: dict[str, np.ndarray]
    nodes_spanned: dict[str, np.ndarray]
    node_of_rank: np.ndarray
    _members: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, layout: ParallelLayout, gpus_per_node: int) -> LayoutTables:
        """Vectorised over ranks and groups (a world of millions of ranks in seconds), for every
        kind a collective can be bound to (``ParallelLayout.bound_kinds``)."""
        ranks = np.arange(layout.world_size, dtype=np.int64)
        node = ranks // gpus_per_node
        fine = fine_coords(layout, ranks)
        index, spanned = {}, {}
        for kind in (k for k in layout.bound_kinds() if k != WORLD):
            gi = group_indices(layout, kind, fine)
            index[kind] = gi.astype(np.int32)
            # Nodes a group spans: its distinct (group, node) pairs.
            nodes = int(node[-1]) + 1
            pairs = np.unique(gi * nodes + node)
            spanned[kind] = np.bincount(pairs // nodes, minlength=layout.group_count(kind)).astype(np.int32)[
                gi
            ]
        index[WORLD] = np.zeros(layout.world_size, np.int32)
        spanned[WORLD] = np.full(layout.world_size, len(np.unique(node)), np.int32)
        return cls(layout=layout, group_index=index, nodes_spanned=spanned, node_of_rank=node)

    def members(self, kind: str) -> np.ndarray:
        """The ranks of every group of ``kind``: (groups, members) by group index, each row in
        group-rank order (ascending). Kept once made: a build asks it for every batch of ranks."""
        if kind not in self._members:
            gi = self.group_index[kind]
            order = np.lexsort((np.arange(len(gi)), gi))
            self._members[kind] = order.reshape(-1, len(gi) // (int(gi.max()) + 1))
        return self._members[kind]

    def position(self, kind: str, rank: np.ndarray) -> np.ndarray:
        """Each rank's place in its group of ``kind`` (its group rank)."""
        row_members = self.members(kind)[self.group_index[kind][rank]]
        return np.argmax(row_members == np.asarray(rank)[:, None], axis=1)

    def absolute_splits(self, kind: str, rank: np.ndarray, relative: np.ndarray) -> np.ndarray:
        """All-to-all splits in group order, (rows, members), from relative ones (item d: bytes to
        the member d places after the row's rank, ``prism.graph.build.normalize.relative_splits``)."""
        size = relative.shape[1]
        shift = (np.arange(size)[None, :] - self.position(kind, rank)[:, None]) % size
        return np.take_along_axis(relative, shift, axis=1)

    def relative_splits(self, kind: str, rank: np.ndarray, splits: np.ndarray) -> np.ndarray:
        """``absolute_splits`` undone: each row's splits from its rank's own place."""
        size = splits.shape[1]
        shift = (np.arange(size)[None, :] + self.position(kind, rank)[:, None]) % size
        return np.take_along_axis(splits, shift, axis=1)

    def all_to_all_volumes(self, kind: str, rank: np.ndarray, relative: np.ndarray) -> np.ndarray:
        """(on-node, off-node) bytes that bound each row's all-to-all, (rows, 2): every member of
        the row's group routes as its rank does (``relative``, from its own place), and the call
        ends when the member that sends or receives the most on its node, and the one that does
        off it, are done (``busiest``)."""
        size = relative.shape[1]
        offset = (np.arange(size)[None, :] - np.arange(size)[:, None]) % size  # sender a, receiver b
        return self._volumes(kind, rank, relative, lambda splits: splits[offset])

    def skewed_volumes(
        self, kind: str, rank: np.ndarray, nbytes: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """``all_to_all_volumes`` when every member sends ``nbytes`` (its row's), shared among the
        members by ``weights`` (one per group rank, summing to 1)."""
        size = len(weights)
        return self._volumes(
            kind, rank, np.asarray(nbytes, np.float64)[:, None], lambda n: np.tile(n[0] * weights, (size, 1))
        )

    def _volumes(self, kind: str, rank: np.ndarray, per_row: np.ndarray, traffic) -> np.ndarray:
        """``busiest`` of each row: ``traffic(values)`` gives its group's (sender, receiver) bytes
        from the row's ``per_row`` values; computed once per distinct (node pattern, values)."""
        groups, group_of_row = np.unique(self.group_index[kind][np.asarray(rank)], return_inverse=True)
        node = self.node_of_rank[self.members(kind)[groups]]  # the rows' groups: (groups, members)
        same = node[:, :, None] == node[:, None, :]
        patterns, pattern_of_group = np.unique(same.reshape(len(node), -1), axis=0, return_inverse=True)
        keys = np.column_stack([pattern_of_group.ravel()[group_of_row.ravel()], per_row])
        distinct, row_of = np.unique(keys, axis=0, return_inverse=True)
        size = node.shape[1]
        volumes = np.empty((len(distinct), 2))
        for k, (pattern, *values) in enumerate(distinct):
            sent = traffic(np.asarray(values, dtype=np.float64))
            volumes[k] = busiest(sent, patterns[int(pattern)].reshape(size, size))
        return volumes[row_of.ravel()]

    def replica_of(self, program: np.ndarray | None = None) -> np.ndarray:
        """For each replica along the layout's fold axis (dp, or dp_replicate under HSDP), the first
        replica whose ranks sit on the nodes alike, position for position: every group of theirs
        spans as many nodes and every pipeline transfer crosses nodes or not alike, so the comm
        model prices their calls alike, and (``program``: each rank's program number, where ranks
        of a stage run different ones) runs the same programs. Without a fold axis, one replica per
        dp index, each its own."""
        layout = self.layout
        ranks = np.arange(layout.world_size)
        axis = layout.fold_axis
        if axis is None:  # groups span some replicas of every axis: each rank is simulated
            return np.arange(layout.dp)
        stride, stage = layout.stride("pp"), (ranks // layout.stride("pp")) % layout.pp
        crosses = [  # each pipeline neighbour on another node (a transfer's price); none at the ends
            (stage + step >= 0)
            & (stage + step < layout.pp)
            & (self.node_of_rank != self.node_of_rank[np.clip(ranks + step * stride, 0, ranks[-1])])
            for step in (1, -1)
        ]
        runs = () if program is None else (np.asarray(program),)
        signature = np.stack([*self.nodes_spanned.values(), *crosses, *runs], axis=1)
        replica = (ranks // layout.stride(axis)) % layout.degree(axis)
        position = ranks - replica * layout.stride(axis)  # the same place in every replica
        by_replica = signature[np.lexsort((position, replica))].reshape(layout.degree(axis), -1)
        _, first, inverse = np.unique(by_replica, axis=0, return_index=True, return_inverse=True)
        return first[inverse.ravel()]


def busiest(sent: np.ndarray, same_node: np.ndarray) -> tuple[float, float]:
    """The most bytes any member sends or receives on its node, and off it, from the (sender,
    receiver) bytes of one all-to-all and whether each pair shares a node. A member's own chunk
    is a local copy, in neither."""
    on = sent * (same_node & ~np.eye(len(sent), dtype=bool))
    off = sent * ~same_node
    return (
        float(max(on.sum(axis=0).max(), on.sum(axis=1).max())),
        float(max(off.sum(axis=0).max(), off.sum(axis=1).max())),
    )
