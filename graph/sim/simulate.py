"""Simulate a graph: every node's start and end, every rank's steady iteration time and peak memory.

The graph holds one iteration. Iteration k+1 of a rank starts when its iteration k ends, so
the simulation runs ``iterations`` passes, each starting every rank at its previous end; the
steady iteration time of a rank is the length of its last pass. The engine's semantics are in
``prism.graph.sim.engine``; ``prism.graph.sim.load`` reads a graph file into a ``SimGraph``.

Peak memory of a rank = its static bytes (what the build recorded from the capture: the
parameters, gradients, optimizer state and gradient buckets its stage holds, and on CUDA what the
device held besides) + the highest running total of the
bytes its nodes allocate and free, in program order (a node's allocations count before its
frees).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from prism.graph.sim.engine import Engine
from prism.graph.sim.fold import fold_replicas
from prism.schemas.layout import ParallelLayout


class SimulationError(RuntimeError):
    """A graph whose ranks cannot all finish (a deadlock) or that is malformed."""


@dataclass(frozen=True, kw_only=True)
class SimGraph:
    """A graph as the engine's arrays (all ranks, rows in (rank, stream, index) order).

    The engine runs lanes: each rank's streams (``lane_rank``), or one lane a rank."""

    layout: ParallelLayout
    """The graph's layout (every rank of it)."""
    static_bytes: np.ndarray
    """Bytes each rank holds across iterations (``prism.graph.sim.load.rank_static_bytes``)."""
    rank_ptr: np.ndarray
    """First row of each lane, and the row count last (with one lane a rank: of each rank)."""
    stage: np.ndarray
    kind: np.ndarray
    dur: np.ndarray
    """Compute: measured; comm: the cost model's (what ``--cluster`` re-costs)."""
    gap: np.ndarray
    is_async: np.ndarray
    slot: np.ndarray
    slot_size: np.ndarray
    slot_nodes_ptr: np.ndarray
    slot_nodes: np.ndarray
    deps_ptr: np.ndarray
    deps: np.ndarray
    alloc: np.ndarray
    free: np.ndarray
    skew: np.ndarray | None = None
    """Expected arrival skew of collectives (``prism.graph.sim.noise``); None: none."""
    deps_lag: np.ndarray | None = None
    """ns added to each entry of ``deps`` (a launch latency), aligned with it; None: none."""
    lane_rank: np.ndarray | None = None
    """The rank (of the ranks held, 0 ...) each lane belongs to, where ranks have several
    streams; None: one lane a rank, ``rank_ptr`` indexes ranks."""
    wake_ns: tuple[np.ndarray, np.ndarray] | None = None
    """The cluster spec's ``wake_compute`` table as (wait ns, extra ns) points from (0, 0)
    (``ClusterSpec.wake_points_ns``); None: compute costs the same after a wait."""

    def wake_points(self) -> tuple[np.ndarray, np.ndarray]:
        """``wake_ns``, or empty arrays (no wake cost) for the engine."""
        return self.wake_ns or (np.zeros(0, np.float64), np.zeros(0, np.float64))

    @cached_property
    def busy_ns(self) -> np.ndarray:
        """What the engine charges each node: its duration, plus the skew a collective waits for.

        Computed once per graph (every simulated iteration and co-simulation engine reuses it);
        a what-if makes a new SimGraph, so changed durations give a new one."""
        return self.dur if self.skew is None else self.dur + self.skew

    @property
    def lanes(self) -> int:
        return len(self.rank_ptr) - 1

    @property
    def ranks(self) -> int:
        return self.lanes if self.lane_rank is None else int(self.lane_rank[-1]) + 1 if self.lanes else 0

    def rank_of_lane(self) -> np.ndarray:
        """The rank of every lane."""
        return np.arange(self.lanes) if self.lane_rank is None else self.lane_rank

    def main_lane(self) -> np.ndarray:
        """Every rank's first lane: its one lane, or of a rank of several streams stream 0, the
        thread that marked its step."""
        return (
            np.arange(self.lanes)
            if self.lane_rank is None
            else np.searchsorted(self.lane_rank, np.arange(self.ranks))
        )

    def node_rank(self) -> np.ndarray:
        """The rank of every node (rows are grouped by rank)."""
        return np.repeat(self.rank_of_lane(), np.diff(self.rank_ptr))

    def node_lane(self) -> np.ndarray:
        """The lane of every node."""
        return np.repeat(np.arange(self.lanes), np.diff(self.rank_ptr))

    def rank_first_row(self) -> np.ndarray:
        """The first row of every rank."""
        if self.lane_rank is None:
            return self.rank_ptr[:-1]
        first_lane = np.searchsorted(self.lane_rank, np.arange(self.ranks))
        return self.rank_ptr[first_lane]

    def rank_rows(self, rank: int) -> slice:
        """The rows of ``rank``, all of its streams (a rank's lanes are consecutive)."""
        if self.lane_rank is None:
            return slice(int(self.rank_ptr[rank]), int(self.rank_ptr[rank + 1]))
        lanes = np.searchsorted(self.lane_rank, [rank, rank + 1])
        return slice(int(self.rank_ptr[lanes[0]]), int(self.rank_ptr[lanes[1]]))


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """What the simulation predicts."""

    start_ns: np.ndarray
    """Start of every node in the last simulated iteration (absolute, from time 0)."""
    end_ns: np.ndarray
    """End of every node in the last simulated iteration."""
    rank_start_ns: np.ndarray
    """When every rank started the last simulated iteration (its main lane: ``SimGraph.main_lane``)."""
    iteration_ns: np.ndarray
    """Steady iteration time of every rank: its slowest lane's period."""
    lane_start_ns: np.ndarray
    """When every lane started the last simulated iteration (of a graph of one lane a rank, the
    ranks' starts)."""
    peak_bytes: np.ndarray
    """Peak memory of every rank."""


MAX_LANE_PASSES = 16
"""Passes a graph of several lanes a rank may run for its periods to repeat."""
MAX_TOTAL_NS = 2**62
"""Bound on the sum of every duration, gap and skew of a graph times the iterations simulated:
no time the engine computes (int64 ns) can then overflow."""


def check_total_time(graph: SimGraph, iterations: int) -> None:
    """Refuse a graph whose times could overflow the engine's int64 clock in ``iterations`` passes."""
    parts = (graph.dur, graph.gap) + (() if graph.skew is None else (graph.skew,))
    total = sum(float(x.sum(dtype=np.float64)) for x in parts)
    if total * iterations >= MAX_TOTAL_NS:
        raise SimulationError(
            f"the graph's durations add up to {total:.3g} ns: {iterations} iteration(s) of it would overflow "
            "the simulation's clock (int64 ns); a duration or gap is far too large"
        )


def peak_bytes(graph: SimGraph) -> np.ndarray:
    """Static bytes plus the highest running total of each rank's allocations, in program order
    (a rank of several streams: the sum of each stream's highest)."""
    delta = graph.alloc - graph.free
    running = np.cumsum(delta)
    before = running - delta  # total before each node
    lane_of = graph.node_lane()
    base = np.concatenate([[0], running])[graph.rank_ptr[:-1]]  # running total at each lane's start
    high = np.full(graph.lanes, 0, np.int64)
    np.maximum.at(high, lane_of, before - base[lane_of] + graph.alloc)
    if graph.lane_rank is not None:
        per_rank = np.zeros(graph.ranks, np.int64)
        np.add.at(per_rank, graph.lane_rank, high)
        high = per_rank
    return graph.static_bytes + high


def _slowest(periods: np.ndarray, graph: SimGraph) -> np.ndarray:
    """Each rank's longest lane period."""
    if graph.lane_rank is None:
        return periods
    out = np.zeros(graph.ranks, np.int64)
    np.maximum.at(out, graph.lane_rank, periods)
    return out


def simulate(graph: SimGraph, *, iterations: int = 2) -> SimResult:
    """Run ``iterations`` back-to-back passes; the last one gives the steady state.

    Identical dp replicas are simulated once (``prism.graph.sim.fold``: exact, every rank's times
    are its representative's). Each lane starts a pass when it ended the one before: a rank's GPU
    streams may still run the last step's work while its CPU thread begins the next, as a GPU
    running behind its CPU does. A rank's iteration is the period of its slowest lane: in a steady
    state every stream of a rank keeps the same pace, or one falls ever further behind. Asked for a
    steady state (``iterations`` >= 2), a graph of several lanes a rank runs more passes until
    every rank's period repeats (at most ``MAX_LANE_PASSES``): ranks whose streams began out of
    step take a few to settle."""
    lanes = graph.lane_rank is not None and iterations >= 2
    check_total_time(graph, max(iterations, MAX_LANE_PASSES) if lanes else iterations)
    folding = fold_replicas(graph)
    g = folding.graph
    lane_rank = g.rank_of_lane()
    clock = np.zeros(g.lanes, np.int64)
    previous = clock
    periods = None
    for done in range(1, (max(iterations, MAX_LANE_PASSES) if lanes else iterations) + 1):
        engine = Engine(g, clock)
        engine.advance()
        start, end, pc = engine.start, engine.end, engine.pc
        stuck = np.flatnonzero(pc < g.rank_ptr[1:])
        if len(stuck):
            stuck = np.flatnonzero(np.isin(folding.rank_of, lane_rank[stuck]))  # as ranks of the full graph
            raise SimulationError(f"deadlock: {len(stuck)} rank(s) cannot finish, first rank {stuck[0]}")
        previous, clock = clock, np.maximum.reduceat(end, g.rank_ptr[:-1])
        periods, settled = _slowest(clock - previous, g), periods
        if done >= iterations and (not lanes or np.array_equal(periods, settled)):
            break
    main = g.main_lane()
    return SimResult(
        start_ns=folding.per_node(start),
        end_ns=folding.per_node(end),
        rank_start_ns=folding.per_rank(previous[main]),
        iteration_ns=folding.per_rank(periods),
        lane_start_ns=previous if g.lane_rank is not None else folding.per_rank(previous),
        peak_bytes=folding.per_rank(peak_bytes(g)),  # folded replicas allocate alike too
    )
