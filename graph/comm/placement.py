"""Where the target layout's groups sit on the cluster's nodes: the comm model's per-rank inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism.schemas.layout import ParallelLayout


@dataclass(frozen=True)
class LayoutTables:
    """Per-rank facts of the target layout, as arrays indexed by global rank."""

    layout: ParallelLayout
    group_index: dict[str, np.ndarray]
    nodes_spanned: dict[str, np.ndarray]
    node_of_rank: np.ndarray

    @classmethod
    def build(cls, layout: ParallelLayout, gpus_per_node: int) -> LayoutTables:
        """Vectorised over ranks and groups (a world of millions of ranks in seconds)."""
        ranks = np.arange(layout.world_size, dtype=np.int64)
        node = ranks // gpus_per_node
        axes = layout.order.split("-")
        coord = {a: (ranks // layout.stride(a)) % layout.degree(a) for a in axes}
        index, spanned = {}, {}
        for axis in ("tp", "dp", "pp"):
            # The group index counts the other axes' coordinates, fastest first (ParallelLayout.group_index).
            gi, scale = np.zeros(layout.world_size, np.int64), 1
            for other in (a for a in axes if a != axis):
                gi += coord[other] * scale
                scale *= layout.degree(other)
            index[axis] = gi.astype(np.int32)
            first = ranks[coord[axis] == 0]  # each group's first member
            members = first[:, None] + np.arange(layout.degree(axis)) * layout.stride(axis)
            on = node[members]  # ascending along each group: count the changes
            per_group = 1 + (np.diff(on, axis=1) > 0).sum(axis=1)
            spanned[axis] = np.empty(layout.world_size, np.int32)
            spanned[axis][members] = per_group[:, None]
        index["world"] = np.zeros(layout.world_size, np.int32)
        spanned["world"] = np.full(layout.world_size, len(np.unique(node)), np.int32)
        return cls(layout=layout, group_index=index, nodes_spanned=spanned, node_of_rank=node)

    def replica_of(self) -> np.ndarray:
        """For each dp replica, the first replica whose ranks sit on the nodes alike, position for
        position: every group of theirs spans as many nodes and every pipeline transfer crosses
        nodes or not alike, so the comm model prices their calls alike."""
        layout = self.layout
        ranks = np.arange(layout.world_size)
        stride, stage = layout.stride("pp"), (ranks // layout.stride("pp")) % layout.pp
        crosses = [  # each pipeline neighbour on another node (a transfer's price); none at the ends
            (stage + step >= 0)
            & (stage + step < layout.pp)
            & (self.node_of_rank != self.node_of_rank[np.clip(ranks + step * stride, 0, ranks[-1])])
            for step in (1, -1)
        ]
        signature = np.stack([*(self.nodes_spanned[a] for a in ("tp", "dp", "pp")), *crosses], axis=1)
        replica = (ranks // layout.stride("dp")) % layout.dp
        position = ranks - replica * layout.stride("dp")  # the same (tp, pp) in every replica
        by_replica = signature[np.lexsort((position, replica))].reshape(layout.dp, -1)
        _, first, inverse = np.unique(by_replica, axis=0, return_index=True, return_inverse=True)
        return first[inverse.ravel()]
