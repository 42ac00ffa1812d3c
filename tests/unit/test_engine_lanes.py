"""The engine's lanes: a node may depend on nodes of other lanes (with a lag), any number of
lanes may wait on one node, and the result is the max-plus solution of the dependencies
whatever order the lanes run in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.graph.sim.engine import COMPUTE, Engine
from prism.graph.sim.simulate import SimGraph
from prism.schemas.layout import ParallelLayout


def lanes_graph(lanes: list[list[tuple[int, int, list[tuple[int, int]]]]]) -> SimGraph:
    """Lanes of compute nodes, each (gap, dur, [(global node, lag), ...])."""
    nodes = [node for lane in lanes for node in lane]
    n = len(nodes)
    deps = [d for _, _, ds in nodes for d in ds]
    return SimGraph(
        layout=ParallelLayout(tp=1, pp=1, dp=1), static_bytes=np.zeros(1, np.int64),
        rank_ptr=np.r_[0, np.cumsum([len(lane) for lane in lanes])].astype(np.int64),
        stage=np.zeros(n, np.int16), kind=np.full(n, COMPUTE, np.int8),
        dur=np.array([d for _, d, _ in nodes], np.int64), gap=np.array([g for g, _, _ in nodes], np.int64),
        is_async=np.zeros(n, np.bool_), slot=np.full(n, -1, np.int32), slot_size=np.zeros(0, np.int64),
        slot_nodes_ptr=np.zeros(1, np.int64), slot_nodes=np.zeros(0, np.int64),
        deps_ptr=np.r_[0, np.cumsum([len(ds) for _, _, ds in nodes])].astype(np.int64),
        deps=np.array([d for d, _ in deps], np.int64), deps_lag=np.array([lag for _, lag in deps], np.int64),
        alloc=np.zeros(n, np.int64), free=np.zeros(n, np.int64),
    )  # fmt: skip


def run(g: SimGraph, clock: np.ndarray | None = None) -> Engine:
    engine = Engine(g, np.zeros(g.ranks, np.int64) if clock is None else clock)
    engine.advance()
    return engine


def test_two_lanes_wait_on_one_node_of_a_third_that_waits_on_a_fourth() -> None:
    # Lane 0 runs first (the top of the queue) and blocks on lane 3's Z; lanes 1 and 2 then
    # both wait on lane 0's A; Z wakes lane 0, whose A wakes both.
    z, a = 5, 0
    g = lanes_graph(
        [
            [(0, 10, [(z, 0)]), (0, 5, [])],  # A (node 0) after Z; B
            [(0, 2, [(a, 3)])],  # C: 3 ns after A ends
            [(1, 4, [(a, 0)]), (0, 1, [(2, 0)])],  # D after A; E after C
            [(0, 7, [])],  # Z (node 5)
        ]
    )
    e = run(g)
    assert e.start.tolist() == [7, 17, 20, 17, 22, 0]
    assert e.end.tolist() == [17, 22, 22, 21, 23, 7]
    assert (e.pc == g.rank_ptr[1:]).all()


def test_a_cycle_across_lanes_leaves_them_unfinished() -> None:
    g = lanes_graph([[(0, 1, [(1, 0)])], [(0, 1, [(0, 0)])]])
    e = run(g)
    assert (e.pc < g.rank_ptr[1:]).all()


@st.composite
def acyclic_lanes(draw):
    """Random lanes whose dependencies point to nodes made earlier (any lane): acyclic."""
    n_lanes = draw(st.integers(1, 5))
    made: list[int] = []  # global ids in creation order
    lanes: list[list[int]] = [[] for _ in range(n_lanes)]
    order = draw(st.lists(st.integers(0, n_lanes - 1), min_size=1, max_size=30))
    spec = {}
    for lane in order:
        deps = (
            draw(st.lists(st.tuples(st.sampled_from(made), st.integers(0, 20)), max_size=3)) if made else []
        )
        node = len(made)
        made.append(node)
        lanes[lane].append(node)
        spec[node] = (draw(st.integers(0, 9)), draw(st.integers(0, 30)), deps)
    lanes = [lane for lane in lanes if lane]
    position = {node: i for i, node in enumerate(node for lane in lanes for node in lane)}  # engine rows
    return [
        [(spec[n][0], spec[n][1], [(position[d], lag) for d, lag in spec[n][2]]) for n in lane]
        for lane in lanes
    ]


def reference(lanes) -> tuple[list[int], list[int]]:
    """start = max(previous end on the lane + gap, each dependency's end + lag), by fixed point."""
    nodes = [node for lane in lanes for node in lane]
    prev, k = [], 0
    for lane in lanes:
        prev += [-1] + list(range(k, k + len(lane) - 1))
        k += len(lane)
    start, end = [None] * len(nodes), [None] * len(nodes)
    while None in end:
        for k, (gap, dur, deps) in enumerate(nodes):
            if (
                end[k] is not None
                or (prev[k] >= 0 and end[prev[k]] is None)
                or any(end[d] is None for d, _ in deps)
            ):
                continue
            t = (end[prev[k]] if prev[k] >= 0 else 0) + gap
            t = max([t] + [end[d] + lag for d, lag in deps])
            start[k], end[k] = t, t + dur
    return start, end


@settings(max_examples=200, deadline=None)
@given(acyclic_lanes())
def test_lanes_give_the_max_plus_solution_of_their_dependencies(lanes) -> None:
    e = run(lanes_graph(lanes))
    start, end = reference(lanes)
    assert e.start.tolist() == start and e.end.tolist() == end
