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
