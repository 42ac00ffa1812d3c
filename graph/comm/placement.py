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
        ranks = np.arange(layout.world_size)
        node = ranks // gpus_per_node
        index, spanned = {}, {}
        for axis in ("tp", "dp", "pp"):
            index[axis] = np.empty(layout.world_size, np.int32)
            spanned[axis] = np.empty(layout.world_size, np.int32)
            for gi, members in enumerate(layout.groups(axis)):
                members = np.asarray(members)
                index[axis][members] = gi
                spanned[axis][members] = len(np.unique(node[members]))
        index["world"] = np.zeros(layout.world_size, np.int32)
        spanned["world"] = np.full(layout.world_size, len(np.unique(node)), np.int32)
        return cls(layout=layout, group_index=index, nodes_spanned=spanned, node_of_rank=node)
