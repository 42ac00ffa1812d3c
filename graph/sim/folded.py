"""Load a graph folded: identical dp replicas read once, from the file, not from memory.

``prism.graph.sim.fold`` folds a graph already in memory; at 131,072 ranks the whole graph does
not fit one. A graph built by prism-build-graph records, for each dp replica, the first replica
whose nodes it repeats (``REPLICA_OF_KEY``: every replica binds the same stage programs, priced
alike where the cluster places them alike). ``load_folded`` reads the representatives alone
(and the replicas of ``keep`` ranks, each on its own), so that memory and time grow with the
distinct replicas, not with the world. The result is the same ``Folding`` the in-memory fold
gives. A graph without the record is loaded whole and folded in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from prism.graph.comm.placement import LayoutTables
from prism.graph.io.parquet import GraphFormatError, read_metadata
from prism.graph.sim.fold import Folding, fold_replicas
from prism.graph.sim.load import load_sim_graph
from prism.schemas import graph_format as gf
from prism.schemas.cluster import ClusterSpec
from prism.schemas.layout import ParallelLayout


def recorded_replicas(path: str | Path) -> np.ndarray | None:
    """Each replica's representative along the layout's fold axis as the graph records it, or None
    where it does not."""
    metadata = read_metadata(path)
    return _recorded(path, metadata, ParallelLayout.from_dict(metadata.layout))


def _recorded(path: str | Path, metadata: gf.GraphMetadata, layout: ParallelLayout) -> np.ndarray | None:
    recorded = metadata.extra.get(gf.REPLICA_OF_KEY)
    if recorded is None or layout.fold_axis is None:
        return None
    if layout.fold_axis == "edp" and metadata.version < 6:
        return None  # recorded when expert parallel without HSDP had no fold axis: one per dp index
    replica_of, count = np.asarray(recorded), layout.degree(layout.fold_axis)
    if (
        replica_of.shape != (count,)
        or replica_of.dtype.kind not in "iu"
        or (replica_of < 0).any()
        or (replica_of >= count).any()
        or (replica_of[replica_of] != replica_of).any()
    ):
        raise GraphFormatError(
            f"{path}: metadata {gf.REPLICA_OF_KEY!r} must give each of the {count} {layout.fold_axis} replicas a "
            "representative that represents itself"
        )
    return replica_of


def load_folded(path: str | Path, keep: Iterable[int] = (), *, cluster: ClusterSpec | None = None) -> Folding:
    """The graph at ``path`` with identical dp replicas read once; the replicas of ``keep``
    ranks stay, each on its own. ``cluster``: replicas must also be priced alike on it (a what-if
    that re-costs communication)."""
    metadata = read_metadata(path)
    layout = ParallelLayout.from_dict(metadata.layout)
    replica_of = _recorded(path, metadata, layout)
    if replica_of is None:
        return fold_replicas(load_sim_graph(path), keep=keep)
    if cluster is not None:  # alike in the file and alike on the new cluster
        again = LayoutTables.build(layout, cluster.gpus_per_node).replica_of()
        _, first, inverse = np.unique(
            np.stack([replica_of, again], axis=1), axis=0, return_index=True, return_inverse=True
        )
        replica_of = first[inverse.ravel()]
    axis = layout.fold_axis
    stride, world = layout.stride(axis), layout.world_size
    keep = sorted(set(keep))
    if keep and not (0 <= keep[0] and keep[-1] < world):
        raise ValueError(f"rank {keep[0] if keep[0] < 0 else keep[-1]} is not in the graph (0..{world - 1})")
    ranks = np.arange(world, dtype=np.int64)
    replica = (ranks // stride) % layout.degree(axis)
    own = np.unique(replica[np.asarray(list(keep), np.int64)]) if keep else np.zeros(0, np.int64)
    representative = _without(replica_of, own)
    kept_ranks = ranks[np.isin(replica, np.unique(representative))]
    graph = load_sim_graph(path, kept_ranks)
    position = ranks - replica * stride
    rank_of = np.searchsorted(kept_ranks, position + representative[replica] * stride)
    counts = np.diff(graph.rank_ptr)[rank_of]
    return Folding(
        graph=graph, rank_of=rank_of, full_rank_ptr=np.r_[0, np.cumsum(counts)].astype(np.int64),
        folded=len(kept_ranks) < world, kept_ranks=kept_ranks,
    )  # fmt: skip


def _without(replica_of: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Each replica's representative once the replicas ``own`` stand for themselves alone (a
    what-if changes them): a class whose representative is one of them is represented by its
    first other member instead, which is read then."""
    representative = replica_of.copy()
    orphans = ~np.isin(np.arange(len(replica_of)), own) & np.isin(replica_of, own)
    for lost in np.unique(replica_of[orphans]):
        members = np.flatnonzero(orphans & (replica_of == lost))
        representative[members] = members[0]
    representative[own] = own
    return representative
