"""Fold identical data-parallel replicas of a graph into one, for the engine.

Every end time of the engine is a pure function of the dependencies (``prism.graph.sim.engine``).
Two dp replicas (the ranks that share a dp index) whose ranks have the same nodes, durations,
gaps, dependencies and allocations, whose groups and transfers inside the replica match position for
position, and which meet other replicas only in collectives that span every replica alike, run
identically: they start together, and each of their members reaches each shared collective at
the same moment, so that collective ends (last arrival + cost) as it would with only one of
them taking part. The engine therefore needs one replica per class of identical ones — plus
every replica holding a rank it does not drive itself (a real rank of a replay, or a rank that
must keep its own times), which is a class of its own. A job of dp=64 is simulated as one
replica (offline) or two (one real rank): 32-64x fewer nodes.

The fold is exact, not a sampling: with ``Folding.rank_of``, every folded rank reads its
representative's times. A graph whose replicas differ (a what-if slowed one rank) keeps the
differing replicas; a graph that does not have the structure above is not folded at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from prism.graph.sim.engine import COLLECTIVE

if TYPE_CHECKING:  # simulate.py folds its graphs: no import cycle at run time
    from prism.graph.sim.simulate import SimGraph

_HASH_SEED = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class Folding:
    """A graph with identical replicas folded, and the way back to every rank of the full one
    (which it does not hold on to: a replay keeps only the folded graph in memory)."""

    graph: SimGraph
    """The folded graph the engine runs (the full one itself when nothing folds)."""
    rank_of: np.ndarray
    """Rank of ``graph`` whose times each rank of the full graph has (its own, or its representative's)."""
    full_rank_ptr: np.ndarray
    """The full graph's first row of every rank (and its node count last)."""
    folded: bool
    kept_ranks: np.ndarray
    """Rank of the full graph that each rank of ``graph`` is."""

    def shift(self, rank: int) -> int:
        """Row of ``graph`` minus row of the full graph, for every node of full rank ``rank``."""
        return int(self.graph.rank_ptr[self.rank_of[rank]] - self.full_rank_ptr[rank])

    def per_rank(self, values: np.ndarray) -> np.ndarray:
        """Per-rank values of ``graph`` for every rank of the full graph."""
        return values[self.rank_of]

    def per_node(self, values: np.ndarray) -> np.ndarray:
        """Per-node values of ``graph`` for every node of the full graph."""
        if not self.folded:
            return values
        full_ptr, ptr = self.full_rank_ptr, self.graph.rank_ptr
        out = np.empty(int(full_ptr[-1]), values.dtype)
        for first, last in _runs(self.rank_of):  # consecutive ranks read consecutive rows
            lo = ptr[self.rank_of[first]]
            out[full_ptr[first] : full_ptr[last + 1]] = values[lo : lo + full_ptr[last + 1] - full_ptr[first]]
        return out


def no_folding(graph: SimGraph) -> Folding:
    ranks = np.arange(graph.ranks, dtype=np.int64)
    return Folding(graph=graph, rank_of=ranks, full_rank_ptr=graph.rank_ptr, folded=False, kept_ranks=ranks)


def fold_replicas(graph: SimGraph, keep: Iterable[int] = ()) -> Folding:
    """Fold the graph's identical replicas along its layout's fold axis (dp, or dp_replicate under
    HSDP); the replicas of ``keep`` ranks stay, each on its own."""
    layout = graph.layout
    axis = layout.fold_axis
    if (
        axis is None
        or layout.degree(axis) == 1
        or graph.ranks != layout.world_size
        or graph.lane_rank is not None
    ):
        return no_folding(graph)  # (ranks of several streams are not folded yet)
    ranks = np.arange(graph.ranks, dtype=np.int64)
    count, stride = layout.degree(axis), layout.stride(axis)
    replica = (ranks // stride) % count
    position = ranks - replica * stride  # the same place in every replica
    signature = _node_signature(graph, replica, position, count)
    if signature is None:
        return no_folding(graph)
    members = [ranks[replica == d] for d in range(count)]  # each in position order
    kept_replicas = sorted({int(replica[r]) for r in keep})
    representative = np.arange(count)
    classes: list[int] = []  # representatives of the classes of folded replicas
    for d in range(count):
        if d in kept_replicas:
            continue
        for c in classes:
            if _same_replica(graph, signature, members[c], members[d]):
                representative[d] = c
                break
        else:
            classes.append(d)
    if len(classes) + len(kept_replicas) == count:
        return no_folding(graph)
    kept_ranks = np.sort(np.concatenate([members[d] for d in sorted(set(classes) | set(kept_replicas))]))
    reduced_id = np.full(graph.ranks, -1, np.int64)
    reduced_id[kept_ranks] = np.arange(len(kept_ranks))
    rank_of = reduced_id[position + representative[replica] * stride]
    return Folding(
        graph=_subgraph(graph, kept_ranks), rank_of=rank_of, full_rank_ptr=graph.rank_ptr, folded=True,
        kept_ranks=kept_ranks,
    )  # fmt: skip


def _node_signature(graph: SimGraph, replica: np.ndarray, position: np.ndarray, dp: int) -> np.ndarray | None:
    """What a node's communication looks like from inside its replica (0 for compute), or None
    if a transfer crosses replicas or a collective spans replicas unevenly (nothing folds)."""
    node_rank = np.searchsorted(graph.rank_ptr, graph.slot_nodes, side="right") - 1
    member_replica, member_position = replica[node_rank], position[node_rank]
    rng = np.random.default_rng(_HASH_SEED)
    code = rng.integers(1, np.iinfo(np.int64).max, size=int(position.max()) + 1, dtype=np.int64)
    starts = graph.slot_nodes_ptr[:-1]
    with np.errstate(over="ignore"):
        slot_hash = np.add.reduceat(code[member_position], starts)  # members' positions
    inside = np.minimum.reduceat(member_replica, starts) == np.maximum.reduceat(member_replica, starts)
    is_p2p = graph.kind[graph.slot_nodes[starts]] != COLLECTIVE
    if (is_p2p & ~inside).any():
        return None
    # A collective across replicas must hold the same positions of every replica.
    across = np.flatnonzero(~inside)
    if len(across):
        mask = np.repeat(~inside, graph.slot_size)
        slot_of = np.repeat(np.arange(len(starts)), graph.slot_size)[mask]
        key = slot_of * dp + member_replica[mask]
        order = np.argsort(key, kind="stable")
        key, hashes = key[order], code[member_position[mask]][order]
        group_starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        group_slot = key[group_starts] // dp
        with np.errstate(over="ignore"):
            group_hash = np.add.reduceat(hashes, group_starts)
        group_size = np.diff(np.r_[group_starts, len(key)])
        replicas_per_slot = np.bincount(group_slot, minlength=len(starts))[across]
        if (replicas_per_slot != dp).any():
            return None
        bounds = np.r_[0, np.cumsum(replicas_per_slot)][:-1]
        for values in (group_hash, group_size):
            if (np.minimum.reduceat(values, bounds) != np.maximum.reduceat(values, bounds)).any():
                return None
    with np.errstate(over="ignore"):
        slot_signature = slot_hash * 3 + inside.astype(np.int64) + graph.slot_size * 7
    signature = np.zeros(len(graph.kind), np.int64)
    comm = graph.slot >= 0
    signature[comm] = slot_signature[graph.slot[comm]]
    return signature


def _runs(ranks: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of ``ranks`` where each is the previous one plus one."""
    breaks = np.flatnonzero(np.diff(ranks) != 1)
    starts, ends = np.r_[0, breaks + 1], np.r_[breaks, len(ranks) - 1]
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _rows(rank_ptr: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Global rows of ``ranks``' nodes, rank after rank."""
    lo, hi = rank_ptr[ranks], rank_ptr[ranks + 1]
    counts = hi - lo
    return np.repeat(lo - np.r_[0, np.cumsum(counts)[:-1]], counts) + np.arange(counts.sum())


def _same_replica(graph: SimGraph, signature: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Do replicas ``a`` and ``b`` (ranks in position order) run identically given the same inputs?

    Compared run by run of consecutive ranks (their rows are one slice), array by array."""
    ptr, deps_ptr = graph.rank_ptr, graph.deps_ptr
    runs_a, runs_b = _runs(a), _runs(b)
    if [y - x for x, y in runs_a] != [y - x for x, y in runs_b]:
        return False
    if not np.array_equal(graph.static_bytes[a], graph.static_bytes[b]):
        return False  # ranks that hold different memory (ranks of another program)
    for (fa, la), (fb, lb) in zip(runs_a, runs_b, strict=True):
        lo_a, hi_a, lo_b, hi_b = ptr[a[fa]], ptr[a[la] + 1], ptr[b[fb]], ptr[b[lb] + 1]
        if not np.array_equal(np.diff(ptr[a[fa] : a[la] + 2]), np.diff(ptr[b[fb] : b[lb] + 2])):
            return False  # ranks of different lengths
        for values in (
            graph.kind,
            graph.busy_ns,
            graph.gap,
            graph.is_async,
            signature,
            graph.alloc,
            graph.free,
        ):
            if not np.array_equal(values[lo_a:hi_a], values[lo_b:hi_b]):
                return False
        if not np.array_equal(np.diff(deps_ptr[lo_a : hi_a + 1]), np.diff(deps_ptr[lo_b : hi_b + 1])):
            return False
        # Dependencies are same-rank rows: relative to the run's first row they must agree.
        deps_a = graph.deps[deps_ptr[lo_a] : deps_ptr[hi_a]] - lo_a
        if not np.array_equal(deps_a, graph.deps[deps_ptr[lo_b] : deps_ptr[hi_b]] - lo_b):
            return False
        lag = graph.deps_lag
        if lag is not None and not np.array_equal(
            lag[deps_ptr[lo_a] : deps_ptr[hi_a]], lag[deps_ptr[lo_b] : deps_ptr[hi_b]]
        ):
            return False
    return True


def _subgraph(graph: SimGraph, ranks: np.ndarray) -> SimGraph:
    """The graph of ``ranks`` alone (sorted); collectives keep only their members among them."""
    rows = _rows(graph.rank_ptr, ranks)
    counts = np.diff(graph.rank_ptr)[ranks]
    rank_ptr = np.r_[0, np.cumsum(counts)].astype(np.int64)
    shift = np.repeat(rank_ptr[:-1] - graph.rank_ptr[ranks], counts)  # new row - old row, per row
    deps_counts = np.diff(graph.deps_ptr)[rows]
    deps = graph.deps[_rows(graph.deps_ptr, rows)] + np.repeat(shift, deps_counts)
    old_slot = graph.slot[rows]
    comm = np.flatnonzero(old_slot >= 0)
    used, new_slot = np.unique(old_slot[comm], return_inverse=True)
    slot = np.full(len(rows), -1, graph.slot.dtype)
    slot[comm] = new_slot
    slot_size = np.bincount(new_slot, minlength=len(used)).astype(np.int64)
    slot_nodes = comm[np.argsort(new_slot, kind="stable")].astype(np.int64)
    skew = None if graph.skew is None else graph.skew[rows]
    deps_lag = None if graph.deps_lag is None else graph.deps_lag[_rows(graph.deps_ptr, rows)]
    return dataclasses.replace(
        graph, static_bytes=graph.static_bytes[ranks], rank_ptr=rank_ptr, stage=graph.stage[rows], kind=graph.kind[rows],
        dur=graph.dur[rows], gap=graph.gap[rows], is_async=graph.is_async[rows], slot=slot,
        slot_size=slot_size, slot_nodes_ptr=np.r_[0, np.cumsum(slot_size)].astype(np.int64),
        slot_nodes=slot_nodes, deps_ptr=np.r_[0, np.cumsum(deps_counts)].astype(np.int64), deps=deps,
        alloc=graph.alloc[rows], free=graph.free[rows], skew=skew, deps_lag=deps_lag,
    )  # fmt: skip
