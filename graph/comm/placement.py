"""Where the target layout's groups sit on the cluster's nodes: the comm model's per-rank inputs."""

from __future__ import annotations

from dataclasses import dataclass

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

    @classmethod
    def build(cls, layout: ParallelLayout, gpus_per_node: int) -> LayoutTables:
        """Vectorised over ranks and groups (a world of millions of ranks in seconds), for every
        group kind of the layout (tp, dp and pp always)."""
        ranks = np.arange(layout.world_size, dtype=np.int64)
        node = ranks // gpus_per_node
        fine = fine_coords(layout, ranks)
        index, spanned = {}, {}
        for kind in dict.fromkeys(("tp", "dp", "pp", *(k for k in layout.kinds() if k != WORLD))):
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
        group-rank order (ascending)."""
        gi = self.group_index[kind]
        order = np.lexsort((np.arange(len(gi)), gi))
        return order.reshape(-1, len(gi) // (int(gi.max()) + 1))

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
        off it, are done: the largest of each over the members, both directions. A member's own
        chunk is a local copy, in neither."""
        gi = self.group_index[kind][np.asarray(rank)]
        node = self.node_of_rank[self.members(kind)]  # (groups, members)
        same = node[:, :, None] == node[:, None, :]
        patterns, pattern_of_group = np.unique(same.reshape(len(node), -1), axis=0, return_inverse=True)
        keys = np.column_stack([pattern_of_group.ravel()[gi], relative])
        distinct, row_of = np.unique(keys, axis=0, return_inverse=True)
        size = relative.shape[1]
        offset = (np.arange(size)[None, :] - np.arange(size)[:, None]) % size  # sender a, receiver b
        others = ~np.eye(size, dtype=bool)
        volumes = np.empty((len(distinct), 2))
        for k, (pattern, *splits) in enumerate(distinct):
            sent = np.asarray(splits, dtype=np.float64)[offset]  # a sends b its split for b - a
            on = patterns[pattern].reshape(size, size) & others
            off = ~patterns[pattern].reshape(size, size)
            volumes[k] = [
                max((sent * on).sum(axis=0).max(), (sent * on).sum(axis=1).max()),
                max((sent * off).sum(axis=0).max(), (sent * off).sum(axis=1).max()),
            ]
        return volumes[row_of.ravel()]

    def replica_of(self) -> np.ndarray:
        """For each replica along the layout's fold axis (dp, or dp_replicate under HSDP), the first
        replica whose ranks sit on the nodes alike, position for position: every group of theirs
        spans as many nodes and every pipeline transfer crosses nodes or not alike, so the comm
        model prices their calls alike. Without a fold axis, one replica per dp index, each its own."""
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
        signature = np.stack([*self.nodes_spanned.values(), *crosses], axis=1)
        replica = (ranks // layout.stride(axis)) % layout.degree(axis)
        position = ranks - replica * layout.stride(axis)  # the same place in every replica
        by_replica = signature[np.lexsort((position, replica))].reshape(layout.degree(axis), -1)
        _, first, inverse = np.unique(by_replica, axis=0, return_index=True, return_inverse=True)
        return first[inverse.ravel()]
