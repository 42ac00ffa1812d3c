"""Smoke test of benchmarks/cosim_cost.py on the checked-in tiny graph: the scripted program
plays every iteration through the clock, and the numbers come out; no speed claim."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def cosim_cost(benchmark_script):
    return benchmark_script("cosim_cost")


def test_scripted_program_plays_every_iteration(cosim_cost) -> None:
    from prism.graph.sim.load import load_sim_graph
    from prism.graph.sim.simulate import simulate
    from prism.replay.graph_clock import GraphClock
    from prism.replay.scripted import FakeWall

    graph = load_sim_graph(cosim_cost.TINY)
    wall = FakeWall()
    clock = GraphClock.open(cosim_cost.TINY, 0, graph, wall_ns=wall)
    seconds = cosim_cost.timed_play(clock, wall, graph, iterations=3, slowdown=1.0)
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    # At the graph's own times the co-simulated iteration is the offline one.
    passes = clock.cosim.passes[0]
    assert len(passes) == 3
    assert passes[-1].rank_end_ns - passes[-1].rank_start_ns == simulate(graph, iterations=3).iteration_ns[0]


def test_cli_prints_the_median_and_rejects_a_missing_graph(cosim_cost, capsys, tmp_path: Path) -> None:
    assert cosim_cost.main(["--iterations", "3", "--warmup", "1"]) == 0
    assert "ms per iteration (median of 2" in capsys.readouterr().out.replace("\n", "")
    with pytest.raises(SystemExit) as exit_info:
        cosim_cost.main([str(tmp_path / "missing.parquet")])
    assert exit_info.value.code == 2
