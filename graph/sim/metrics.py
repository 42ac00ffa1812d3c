"""Where each rank's iteration goes, and the critical path through the whole job.

A rank's iteration splits exactly into:
- compute: spans of its compute nodes (their durations, and the wake cost after a wait);
- overhead: the gaps before nodes (CPU time between ops: Python, launch, framework);
- exposed communication: time blocked in synchronous collectives (arrival to end) and
  waiting for asynchronous collectives;
- bubble: time waiting for pipeline transfers (their peers' progress).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism.graph.sim.engine import COLLECTIVE, COMPUTE, RECV, SEND
from prism.graph.sim.simulate import SimGraph, SimResult


@dataclass(frozen=True, kw_only=True)
class RankBreakdown:
    """Per-rank split of the last simulated iteration (arrays indexed by rank, ns)."""

    compute_ns: np.ndarray
    overhead_ns: np.ndarray
    exposed_comm_ns: np.ndarray
    bubble_ns: np.ndarray


def _idle_before(graph: SimGraph, result: SimResult) -> np.ndarray:
    """Time each node waited after its rank reached it (for dependencies to complete)."""
    start, end = result.start_ns, result.end_ns
    progress = np.where(graph.is_async, start, end)  # where the program was after each node
    reached = np.empty_like(start)
    reached[1:] = progress[:-1]
    firsts = graph.rank_ptr[:-1]  # of every lane
    reached[firsts] = result.lane_start_ns
    return start - (reached + graph.gap)


def _waits_on_transfers(graph: SimGraph) -> np.ndarray:
    """Nodes with at least one dependency on a send or recv."""
    dep_kind = graph.kind[graph.deps]
    is_transfer = (dep_kind == SEND) | (dep_kind == RECV)
    owner = np.repeat(np.arange(len(graph.kind)), np.diff(graph.deps_ptr))
    flags = np.zeros(len(graph.kind), bool)
    flags[owner[is_transfer]] = True
    return flags


def breakdown(graph: SimGraph, result: SimResult) -> RankBreakdown:
    """The split of each rank's iteration; of a rank of several streams, of its main thread's
    (stream 0: its CUDA calls as compute, the CPU work between them as overhead, and its waits
    for the GPU as exposed communication)."""
    rank = graph.node_rank()
    idle = _idle_before(graph, result)
    span = result.end_ns - result.start_ns
    sync_coll = (graph.kind == COLLECTIVE) & ~graph.is_async
    on_transfers = _waits_on_transfers(graph)
    counted = None
    if graph.lane_rank is not None:
        main = np.searchsorted(graph.lane_rank, np.arange(graph.ranks))  # each rank's first lane
        counted = np.isin(graph.node_lane(), main)

    def per_rank(values: np.ndarray) -> np.ndarray:
        weights = values if counted is None else np.where(counted, values, 0)
        return np.bincount(rank, weights=weights, minlength=graph.ranks).astype(np.int64)

    compute = per_rank(np.where(graph.kind == COMPUTE, span, 0))
    overhead = per_rank(graph.gap.astype(np.float64))
    comm = per_rank(np.where(sync_coll, span, 0) + np.where(~on_transfers, idle, 0))
    bubble = per_rank(np.where(on_transfers, idle, 0))
    return RankBreakdown(compute_ns=compute, overhead_ns=overhead, exposed_comm_ns=comm, bubble_ns=bubble)


def critical_path(graph: SimGraph, result: SimResult) -> np.ndarray:
    """Nodes (global rows, in time order) of the chain that ends last, across ranks.

    From the node that ends last, step to whatever made each node start when it did: the
    last-arriving member of a collective or transfer, the latest dependency, or the node
    before it on its rank.
    """
    start, end = result.start_ns, result.end_ns
    firsts = np.zeros(len(start), bool)
    firsts[graph.rank_ptr[:-1]] = True
    node = int(np.argmax(end))
    path, seen = [node], {node}
    while True:
        slot = graph.slot[node]
        if slot >= 0:
            members = graph.slot_nodes[graph.slot_nodes_ptr[slot] : graph.slot_nodes_ptr[slot + 1]]
            node = int(members[np.argmax(start[members])])  # the last to arrive held everyone up
        span = slice(graph.deps_ptr[node], graph.deps_ptr[node + 1])
        deps = graph.deps[span]
        ready = end[deps] + (0 if graph.deps_lag is None else graph.deps_lag[span])
        latest = int(np.argmax(ready)) if len(deps) else -1
        if latest >= 0 and ready[latest] == start[node]:
            node = int(deps[latest])
        elif firsts[node]:
            break
        else:
            node -= 1
        if node in seen:  # zero-length nodes can tie; never loop
            break
        path.append(node)
        seen.add(node)
    return np.array(path[::-1], np.int64)
