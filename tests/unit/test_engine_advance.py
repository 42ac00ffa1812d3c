"""Bounded advances of the engine: stopping anywhere between nodes changes no result."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from test_simulate import config, one_f_one_b_programs, write

from prism.graph.sim.engine import Engine
from prism.graph.sim.load import load_sim_graph


def graph(tmp_path_factory) -> object:
    path = write(
        tmp_path_factory.mktemp("g") / "g.parquet",
        config(pp=4, microbatches=8),
        one_f_one_b_programs(4, 8, 10, 20),
    )
    return load_sim_graph(path)


def test_advancing_in_chunks_gives_the_full_advance(tmp_path_factory) -> None:
    g = graph(tmp_path_factory)
    whole = Engine(g, np.zeros(g.ranks, np.int64))
    whole.advance()
    for budget in (1, 3, 17):
        chunked = Engine(g, np.zeros(g.ranks, np.int64), order=np.arange(g.ranks)[::-1])
        chunks = 1
        while not chunked.advance(budget=budget):
            chunks += 1
        assert chunks >= len(g.kind) // budget
        assert np.array_equal(chunked.start, whole.start) and np.array_equal(chunked.end, whole.end)


@given(st.integers(0, 10_000))
def test_a_target_stops_the_advance_once_it_has_an_end(tmp_path_factory, pick: int) -> None:
    g = graph(tmp_path_factory)
    target = pick % len(g.kind)
    engine = Engine(g, np.zeros(g.ranks, np.int64))
    engine.advance(target=target)
    assert engine.end[target] >= 0
    engine.advance()
    whole = Engine(g, np.zeros(g.ranks, np.int64))
    whole.advance()
    assert np.array_equal(engine.end, whole.end)


def test_the_ranks_ordered_first_run_first(tmp_path_factory) -> None:
    g = graph(tmp_path_factory)
    engine = Engine(g, np.zeros(g.ranks, np.int64), order=np.array([2, 0, 1, 3]))
    engine.advance(budget=1)  # rank 2 posts its first recv, then the budget is spent
    assert np.flatnonzero(engine.start >= 0).tolist() == [int(g.rank_ptr[2])]
