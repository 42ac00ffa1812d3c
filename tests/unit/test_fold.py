"""Folding identical dp replicas: the engine runs fewer ranks and every time stays exactly the same."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_graph_clock import named
from test_simulate import collective, compute, config, one_f_one_b_programs, write

import prism.replay.cosim as cosim_module
from prism.graph.sim.engine import Engine
from prism.graph.sim.fold import fold_replicas, no_folding
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import SimGraph, peak_bytes, simulate
from prism.graph.sim.whatif import SlowRank, WhatIf, apply_what_if
from prism.replay.graph_clock import GraphClock
from prism.replay.scripted import FakeWall, play
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import NodeKind

TP, PP, DP, MICROBATCHES = 2, 2, 4, 4


def replicated_programs(*, cross_replica_transfer: bool = False) -> list[list[dict]]:
    """tp=2 pp=2 dp=4: a 1F1B pipeline per replica, a tp all-reduce after every compute, one dp
    all-reduce of the gradients at the end; durations differ by position, not by replica."""
    layout = config(tp=TP, pp=PP, dp=DP).layout
    stage_programs = one_f_one_b_programs(PP, MICROBATCHES, 10, 20)
    programs = []
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        nodes: list[dict] = []
        moved: list[int] = []  # index of each node of the stage program among ``nodes``
        tp_seq = 0
        for node in stage_programs[c.pp]:
            node = dict(node)
            moved.append(len(nodes))
            if node[gf.KIND] == NodeKind.COMPUTE.value:
                if node[gf.DUR_NS]:  # forwards keep activations, backwards free them
                    node[gf.ALLOC_BYTES if node[gf.DUR_NS] == 10 else gf.FREE_BYTES] = 64 * (1 + c.tp + c.pp)
                    node[gf.DUR_NS] += 3 * c.pp + c.tp  # positions differ
                if node.get(gf.DEPS):  # the pipeline waits' transfers moved with the inserted calls
                    node[gf.DEPS] = [moved[d] for d in node[gf.DEPS]]
                nodes.append(node)
                if node[gf.DUR_NS]:
                    tp_group = layout.group_index(rank, "tp")
                    coll = 1_000 * (tp_group + 1) + tp_seq
                    nodes.append(collective(coll, 7, TP, **{gf.GROUP_INDEX: tp_group}))
                    tp_seq += 1
            else:
                peer_stage = node[gf.PEER]
                node[gf.PEER] = layout.rank(tp=c.tp, dp=c.dp, pp=peer_stage)
                nodes.append(node)
        dp_group = layout.group_index(rank, "dp")
        nodes.append(
            collective(100_000 + dp_group, 40, DP, **{gf.GROUP_KIND: "dp", gf.GROUP_INDEX: dp_group})
        )
        nodes.append(compute(5 + c.pp))
        programs.append(nodes)
    if cross_replica_transfer:  # replica 0's first rank sends to replica 1's at the very end
        a, b = layout.rank(tp=0, dp=0, pp=0), layout.rank(tp=0, dp=1, pp=0)
        programs[a].append({**_transfer(NodeKind.SEND, b), gf.IS_ASYNC: False})
        programs[b].append({**_transfer(NodeKind.RECV, a), gf.IS_ASYNC: False})
    return named(programs)


def _transfer(kind: NodeKind, peer: int) -> dict:
    return {gf.KIND: kind.value, gf.PEER: peer, gf.P2P_SEQ: 99, gf.DUR_NS: 3, gf.GROUP_SIZE: 2}


def replicated(tmp_path: Path, **how) -> tuple[SimGraph, Path]:
    path = write(
        tmp_path / "g.parquet",
        config(tp=TP, pp=PP, dp=DP, microbatches=MICROBATCHES),
        replicated_programs(**how),
    )
    return load_sim_graph(path), path


def unfolded_simulate(graph: SimGraph, iterations: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The engine's passes over every rank, as ``simulate`` ran them before folding."""
    clock = previous = np.zeros(graph.ranks, np.int64)
    for _ in range(iterations):
        engine = Engine(graph, clock)
        engine.advance()
        assert (engine.pc == graph.rank_ptr[1:]).all()
        previous, clock = clock, np.maximum.reduceat(engine.end, graph.rank_ptr[:-1])
    return engine.start, engine.end, clock - previous


def assert_simulate_is_exact(graph: SimGraph) -> None:
    start, end, iteration = unfolded_simulate(graph, 3)
    result = simulate(graph, iterations=3)
    np.testing.assert_array_equal(result.start_ns, start)
    np.testing.assert_array_equal(result.end_ns, end)
    np.testing.assert_array_equal(result.iteration_ns, iteration)
    np.testing.assert_array_equal(result.peak_bytes, peak_bytes(graph))


def test_identical_replicas_fold_into_one_and_simulate_exactly(tmp_path: Path) -> None:
    graph, _ = replicated(tmp_path)
    folding = fold_replicas(graph)
    assert folding.graph.ranks == TP * PP
    assert len(folding.graph.kind) * DP == len(graph.kind)
    assert_simulate_is_exact(graph)
    # The dp all-reduce is charged what it costs for all dp members, with one member left per group.
    dp_rows = np.flatnonzero(folding.graph.slot_size[folding.graph.slot] == 1)
    assert len(dp_rows) == TP * PP and (folding.graph.dur[dp_rows] == 40).all()


def test_a_replica_that_differs_keeps_its_own_times(tmp_path: Path) -> None:
    graph, path = replicated(tmp_path)
    layout = graph.layout
    slow = layout.rank(tp=1, dp=2, pp=1)
    slowed = apply_what_if(graph, path, WhatIf(slow_ranks=(SlowRank(rank=slow, factor=1.5),)))
    folding = fold_replicas(slowed)
    assert folding.graph.ranks == 2 * TP * PP  # replica 2 on its own, the other three as one
    assert len(set(folding.rank_of[list(layout.group(slow, "dp"))])) == 2
    assert_simulate_is_exact(slowed)
    result = simulate(slowed, iterations=3)
    assert result.iteration_ns.min() > simulate(graph, iterations=3).iteration_ns.max()  # dp waits for it


def test_kept_ranks_keep_their_replica(tmp_path: Path) -> None:
    graph, _ = replicated(tmp_path)
    layout = graph.layout
    keep = layout.rank(tp=1, dp=3, pp=0)
    folding = fold_replicas(graph, keep=(keep,))
    assert folding.graph.ranks == 2 * TP * PP
    kept = folding.rank_of[keep]
    assert kept not in folding.rank_of[[r for r in range(graph.ranks) if layout.coords(r).dp != 3]]
    rows = np.arange(graph.rank_ptr[keep], graph.rank_ptr[keep + 1])
    np.testing.assert_array_equal(folding.graph.dur[rows + folding.shift(keep)], graph.dur[rows])


def test_a_transfer_across_replicas_prevents_folding(tmp_path: Path) -> None:
    graph, _ = replicated(tmp_path, cross_replica_transfer=True)
    assert not fold_replicas(graph).folded
    assert_simulate_is_exact(graph)


def test_replicas_that_are_all_different_are_not_folded(tmp_path: Path) -> None:
    graph, _ = replicated(tmp_path)
    dur = graph.dur.copy()
    dur[graph.rank_ptr[:-1]] += np.arange(graph.ranks)  # every rank's first node differs
    assert not fold_replicas(replace(graph, dur=dur)).folded
    alloc = graph.alloc.copy()
    alloc[graph.rank_ptr[:-1]] += np.arange(graph.ranks)  # ... or allocates differently
    assert not fold_replicas(replace(graph, alloc=alloc)).folded
    assert_simulate_is_exact(replace(graph, alloc=alloc))


@pytest.mark.parametrize("slowdown", [1.0, 1.3])
def test_co_simulation_on_folded_replicas_is_exact(tmp_path: Path, monkeypatch, slowdown: float) -> None:
    graph, path = replicated(tmp_path)
    layout = graph.layout
    real, peers = layout.rank(tp=1, dp=1, pp=1), (0, layout.rank(tp=1, dp=3, pp=1))

    def replay(fold) -> GraphClock:
        monkeypatch.setattr(cosim_module, "fold_replicas", fold)
        wall = FakeWall()
        clock = GraphClock.open(path, real, graph, wall_ns=wall, trace_ranks=peers)
        clock.done = play(clock, wall, graph, iterations=3, slowdown=slowdown)
        return clock

    folded = replay(fold_replicas)
    full = replay(lambda g, keep: no_folding(g))
    assert folded.cosim.folding.graph.ranks == 2 * TP * PP
    assert folded.done == full.done  # every completion of the real rank's calls
    for a, b in zip(folded.cosim.pass_iterations, full.cosim.pass_iterations, strict=True):
        np.testing.assert_array_equal(a, b)
    for (fs, fe), (us, ue) in zip(folded.cosim.traced, full.cosim.traced, strict=True):
        for r in peers:
            np.testing.assert_array_equal(fs[r], us[r])
            np.testing.assert_array_equal(fe[r], ue[r])
    if slowdown > 1:  # the virtual replicas wait for the slow real rank in the dp all-reduce
        assert (full.cosim.pass_iterations[-1] > simulate(graph, iterations=3).iteration_ns.min()).all()


def test_a_replica_waiting_on_other_calls_is_not_folded_with_the_rest(tmp_path: Path) -> None:
    graph, _ = replicated(tmp_path)
    layout = graph.layout
    rank = layout.rank(tp=0, dp=2, pp=0)
    rows = np.arange(graph.rank_ptr[rank], graph.rank_ptr[rank + 1])
    waits = rows[np.diff(graph.deps_ptr)[rows] > 0]
    deps = graph.deps.copy()
    deps[graph.deps_ptr[waits[-1]]] -= 1  # the last pipeline wait now waits on another node of the rank
    folding = fold_replicas(replace(graph, deps=deps))
    assert folding.graph.ranks == 2 * TP * PP
    assert folding.rank_of[rank] != folding.rank_of[layout.rank(tp=0, dp=1, pp=0)]
