"""Co-simulation: ranks driven from outside with the graph's own times reproduce the offline run exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_simulate import collective, compute, config, one_f_one_b_programs, write

from prism.graph.sim.engine import COMPUTE, Engine
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import SimGraph


def drive(graph: SimGraph, external: list[int], slowdown: float = 1.0) -> Engine:
    """Play the external ranks like real programs that take the graph's durations (times ``slowdown``)."""
    mask = np.zeros(graph.ranks, bool)
    mask[external] = True
    engine = Engine(graph, np.zeros(graph.ranks, np.int64), external=mask)
    engine.advance()
    progressed = True
    while progressed:
        progressed = False
        for r in external:
            while not engine.done(r):
                i = engine.next_node(r)
                if engine.start[i] < 0:
                    deps = graph.deps[graph.deps_ptr[i] : graph.deps_ptr[i + 1]]
                    if (engine.end[deps] < 0).any():
                        break  # the real program would be blocked in a wait
                    ready = max([engine.clock[r] + graph.gap[i], *engine.end[deps]])
                    engine.arrive_external(r, int(ready))
                if graph.kind[i] == COMPUTE:
                    engine.finish_external(r, int(engine.start[i] + round(graph.dur[i] * slowdown)))
                elif graph.is_async[i]:
                    engine.finish_external(r, int(engine.start[i]))
                elif engine.end[i] >= 0:
                    engine.finish_external(r, int(engine.end[i]))
                else:
                    break  # blocked in a collective until the virtual peers arrive
                progressed = True
        engine.advance()
    return engine


def offline(graph: SimGraph) -> Engine:
    engine = Engine(graph, np.zeros(graph.ranks, np.int64))
    engine.advance()
    return engine


@pytest.mark.parametrize("external", [[0], [2], [1, 2], [0, 1, 2, 3]])
def test_external_ranks_with_graph_times_give_the_offline_result(tmp_path: Path, external: list[int]) -> None:
    graph = load_sim_graph(
        write(tmp_path / "g.parquet", config(pp=4, microbatches=8), one_f_one_b_programs(4, 8, 10, 20))
    )
    expected, got = offline(graph), drive(graph, external)
    assert all(got.done(r) for r in range(graph.ranks))
    np.testing.assert_array_equal(got.start, expected.start)
    np.testing.assert_array_equal(got.end, expected.end)


def test_external_rank_in_a_collective(tmp_path: Path) -> None:
    programs = [
        [compute(100), collective(7, 50, 2), compute(10)],
        [compute(300), collective(7, 50, 2), compute(10)],
    ]
    graph = load_sim_graph(write(tmp_path / "g.parquet", config(tp=2), programs))
    for external in ([0], [1]):
        got = drive(graph, external)
        np.testing.assert_array_equal(got.end, offline(graph).end)


def test_a_slower_external_rank_moves_its_virtual_peers(tmp_path: Path) -> None:
    graph = load_sim_graph(
        write(tmp_path / "g.parquet", config(pp=4, microbatches=8), one_f_one_b_programs(4, 8, 10, 20))
    )
    base, slow = drive(graph, [1]), drive(graph, [1], slowdown=1.5)
    last = graph.rank_ptr[1:] - 1
    assert (slow.end[last] > base.end[last]).all()  # every stage waits for the slow one
