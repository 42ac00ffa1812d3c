"""The replay clock: a real rank played against the graph's virtual ranks, with a fake wall clock.

A scripted "program" walks the real rank's nodes as a real program would: it computes for the
graph's durations (times a slowdown), makes its calls, and waits for their completions. With the
graph's own times it must see exactly the offline simulation; slowed down, its virtual peers
must move exactly as the offline what-if with the same slowdown predicts.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_simulate import collective, compute, config, one_f_one_b_programs, write

from prism.graph.sim.engine import COMPUTE, Engine
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import SimGraph, simulate
from prism.graph.sim.whatif import SlowRank, WhatIf, apply_what_if
from prism.peers.clock import PendingCall
from prism.replay.cosim import CoSimulation, predicted_phase_ns
from prism.replay.graph_clock import DivergenceError, GraphClock, RankProgram
from prism.replay.scripted import ORIGIN_NS as ORIGIN
from prism.replay.scripted import FakeWall, play
from prism.schemas import graph_format as gf


def named(programs: list[list[dict]]) -> list[list[dict]]:
    """Give comm nodes the names a program's calls carry."""
    for nodes in programs:
        for n in nodes:
            kind = n[gf.KIND]
            if kind in ("send", "recv"):
                n[gf.NAME], n[gf.BYTES] = kind, 64
            elif kind == "collective":
                n[gf.NAME], n[gf.BYTES] = "all_reduce", 32
    return programs


def played(path: Path, graph: SimGraph, rank: int, *, wall: FakeWall | None = None, **how) -> tuple[GraphClock, list[dict[int, int]]]:  # fmt: skip
    """A clock for ``rank`` on a fake wall, and the completions of its played program."""
    wall = wall or FakeWall()
    clock = GraphClock.open(path, rank, graph, wall_ns=wall, ahead=how.pop("ahead", False))
    return clock, play(clock, wall, graph, **how)


def pipeline(tmp_path: Path) -> tuple[SimGraph, Path]:
    path = write(
        tmp_path / "g.parquet", config(pp=4, microbatches=8), named(one_f_one_b_programs(4, 8, 10, 20))
    )
    return load_sim_graph(path), path


def tp_pair(tmp_path: Path) -> tuple[SimGraph, Path]:
    programs = [
        [compute(100), collective(7, 50, 2, **{gf.GROUP_INDEX: 0}), compute(10)],
        [compute(300), collective(7, 50, 2, **{gf.GROUP_INDEX: 0}), compute(10)],
    ]
    path = write(tmp_path / "g.parquet", config(tp=2), named(programs))
    return load_sim_graph(path), path


def comm_rows(graph: SimGraph, rank: int) -> np.ndarray:
    rows = np.arange(graph.rank_ptr[rank], graph.rank_ptr[rank + 1])
    return rows[graph.kind[rows] != COMPUTE]


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_graph_times_give_the_offline_simulation(tmp_path: Path, rank: int, ahead: bool) -> None:
    graph, path = pipeline(tmp_path)
    clock, done = played(path, graph, rank, iterations=3, ahead=ahead)
    expected = simulate(graph, iterations=3)
    rows = comm_rows(graph, rank)
    assert [done[-1][r] - ORIGIN for r in rows] == list(expected.end_ns[rows])
    steady = [p.rank_end_ns - p.rank_start_ns for p in clock.cosim.passes[rank]]
    assert steady[-1] == expected.iteration_ns[rank]
    assert all(s.stall_ns == 0 for s in clock.iterations)
    # Ahead, most calls are named by the rank from a rule (the co-simulation checked each one).
    answered_ahead = sum(s.ahead for s in clock.iterations)
    assert answered_ahead > (sum(s.calls for s in clock.iterations) // 2 if ahead else -1)
    assert answered_ahead == 0 or ahead


def test_a_collective_completes_when_the_slower_virtual_member_arrives(tmp_path: Path) -> None:
    graph, path = tp_pair(tmp_path)
    _, done = played(path, graph, 0, iterations=1)
    assert done[0][1] - ORIGIN == 350  # rank 1 arrives at 300, then 50 of transfer


def test_ahead_every_call_a_virtual_peer_already_waits_in_is_named_by_the_rank(tmp_path: Path) -> None:
    # The virtual rank reaches the collective first in every iteration; its next pass starts as
    # soon as the real rank is past its last call, so even a pass's first call has its rule.
    graph, path = tp_pair(tmp_path)
    clock, done = played(path, graph, 0, iterations=3, slowdown=4.0, ahead=True)
    assert [s.ahead for s in clock.iterations] == [0, 1, 1]  # the first: before any event
    # 4 x 100 of compute, the collective's 50 after the rank's (later) arrival, 4 x 10.
    assert [p.rank_end_ns - p.rank_start_ns for p in clock.cosim.passes[0]] == [490, 490, 490]


@pytest.mark.parametrize(("slowdown", "end"), [(1.0, 300 + round(40 / math.sqrt(1 / math.pi) / math.sqrt(2 * math.pi)) + 50), (5 / 3, 550)])  # fmt: skip
def test_a_real_member_waits_only_for_its_virtual_members_noise(
    tmp_path: Path, slowdown: float, end: int
) -> None:
    # Both ranks compute 300, then a collective whose skew (40) is the expected wait for the
    # later of two noisy arrivals. The real rank's arrival is real, noise included: it waits
    # only for the one virtual member's, E[max(t, t + N(0, sigma))] - t = sigma * phi(0) when
    # they meet at once (sigma = 40 / e_2), and nothing when it comes well after it.
    skewed = {gf.GROUP_INDEX: 0, gf.SKEW_NS: 40}
    programs = [[compute(300), collective(7, 50, 2, **skewed), compute(10)] for _ in range(2)]
    path = write(tmp_path / "g.parquet", config(tp=2), named(programs))
    graph = load_sim_graph(path)
    assert simulate(graph, iterations=1).end_ns[1] == 300 + 50 + 40  # offline: both noisy
    _, done = played(path, graph, 0, iterations=1, slowdown=slowdown)
    assert done[0][1] - ORIGIN == end


def test_engine_time_is_stall_the_emulated_job_does_not_see(tmp_path: Path, monkeypatch) -> None:
    graph, path = pipeline(tmp_path)
    wall = FakeWall()

    def slow_advance(engine: Engine) -> None:  # every engine step takes 1 µs of wall time
        real_advance(engine)
        wall.now += 1_000

    real_advance = Engine.advance
    monkeypatch.setattr(Engine, "advance", slow_advance)
    clock, _ = played(path, graph, 2, wall=wall, iterations=2)
    expected = simulate(graph, iterations=2)
    last = clock.cosim.passes[2][-1]
    assert last.rank_end_ns - last.rank_start_ns == expected.iteration_ns[2]
    assert all(s.stall_ns > 0 and s.clock_ns >= s.stall_ns for s in clock.iterations)
    assert all(0 <= s.late_ns <= s.stall_ns for s in clock.iterations)  # late answers: part of the stall


@pytest.mark.parametrize("ahead", [False, True])
def test_a_slower_real_rank_moves_its_peers_as_the_offline_what_if(tmp_path: Path, ahead: bool) -> None:
    graph, path = pipeline(tmp_path)
    clock, _ = played(path, graph, 1, iterations=3, slowdown=1.5, ahead=ahead)
    what_if = simulate(
        apply_what_if(graph, path, WhatIf(slow_ranks=(SlowRank(rank=1, factor=1.5),))), iterations=3
    )
    np.testing.assert_array_equal(
        clock.cosim.pass_iterations[-1], what_if.iteration_ns
    )  # every rank, exactly
    assert (what_if.iteration_ns > simulate(graph, iterations=3).iteration_ns).all()  # it did move them


def test_a_call_the_graph_does_not_expect_names_both(tmp_path: Path) -> None:
    graph, path = pipeline(tmp_path)
    with pytest.raises(
        DivergenceError, match=r"made recv .* 65 bytes.*graph expects recv with peer 0 \(64 bytes\)"
    ):
        played(path, graph, 1, iterations=1, bytes_off=1)


def test_an_iteration_that_ends_early_is_a_divergence(tmp_path: Path) -> None:
    graph, path = tp_pair(tmp_path)
    clock = GraphClock.open(path, 0, graph)
    clock.iteration_started(ORIGIN)
    with pytest.raises(DivergenceError, match="iteration ended, but the graph expects all_reduce on tp.0"):
        clock.iteration_done(ORIGIN + 100)


def test_a_wait_the_virtual_peers_can_never_end_is_reported_at_once(tmp_path: Path) -> None:
    # Rank 0 waits in a collective first; its virtual peer first needs rank 0's send.
    programs = named(
        [
            [collective(1, 5, 2, **{gf.GROUP_INDEX: 0}), {gf.KIND: "send", gf.PEER: 1, gf.P2P_SEQ: 0, gf.IS_ASYNC: True}],
            [{gf.KIND: "recv", gf.PEER: 0, gf.P2P_SEQ: 0}, collective(1, 5, 2, **{gf.GROUP_INDEX: 0})],
        ]
    )  # fmt: skip
    path = write(tmp_path / "g.parquet", config(tp=2), programs)
    with pytest.raises(DivergenceError, match="can never complete"):
        played(path, load_sim_graph(path), 0, iterations=1)


def test_calls_outside_iterations_complete_at_once(tmp_path: Path) -> None:
    graph, path = tp_pair(tmp_path)
    clock = GraphClock.open(path, 0, graph)
    got = []
    call = PendingCall(
        op="barrier", group="0", label="world", group_size=2, gseq=0, bytes=0, peer=None, enter_ns=5
    )
    clock.submit(call, got.append)
    assert got == [None]


def test_time_by_phase_adds_up_to_the_iteration(tmp_path: Path) -> None:
    programs = [
        [
            compute(100, **{gf.PHASE: "fwd"}),
            collective(7, 50, 2, **{gf.GROUP_INDEX: 0, gf.PHASE: "fwd"}),
            compute(10, **{gf.PHASE: "optim"}),
        ],  # fmt: skip
        [compute(300), collective(7, 50, 2, **{gf.GROUP_INDEX: 0}), compute(10)],
    ]
    path = write(tmp_path / "g.parquet", config(tp=2), named(programs))
    clock, _ = played(path, load_sim_graph(path), 0, iterations=1)
    record = clock.cosim.passes[0][0]
    assert record.phase_ns == {"fwd": 350, "optim": 10}
    assert sum(record.phase_ns.values()) == record.rank_end_ns - record.rank_start_ns
    assert clock.iterations[0].calls == 1


@pytest.mark.parametrize("rank", [0, 2])
def test_time_by_phase_with_graph_times_is_the_offline_split(tmp_path: Path, rank: int) -> None:
    programs = named(one_f_one_b_programs(4, 8, 10, 20))
    for nodes in programs:
        for n in nodes:
            n[gf.PHASE] = {"compute": "fwd" if n[gf.DUR_NS] == 10 else "bwd"}.get(n[gf.KIND], n[gf.KIND])
            n[gf.GAP_NS] = 3
    path = write(tmp_path / "g.parquet", config(pp=4, microbatches=8), programs)
    graph = load_sim_graph(path)
    clock, _ = played(path, graph, rank, iterations=3)
    expected = predicted_phase_ns(graph, simulate(graph, iterations=3), clock.program)
    assert clock.cosim.passes[rank][-1].phase_ns == expected
    assert sum(expected.values()) == simulate(graph, iterations=3).iteration_ns[rank]


# -- several real ranks, one co-simulation ---------------------------------------------------------------
class SharedPort:
    """The coordinator without its socket: one co-simulation, each rank's resolutions to its clock."""

    dilates = False

    def __init__(self, cosim: CoSimulation, rank: int, clocks: dict[int, GraphClock]) -> None:
        self.cosim, self.rank, self.clocks = cosim, rank, clocks

    def bind(self, rank: int, on_resolved) -> None:
        pass

    def ruled_end(self, pass_: int, index: int, t_ns: int) -> None:
        return None

    def origin(self, wall_ns: int) -> int:
        return ORIGIN

    def send(self, events) -> None:
        for event in events:
            for r in self.cosim.handle(self.rank, event):
                self.clocks[r.rank]._on_resolved([r])


def two_real(path: Path, graph: SimGraph, wall: FakeWall) -> dict[int, GraphClock]:
    cosim = CoSimulation(graph, {r: RankProgram.read(path, r) for r in (0, 1)})
    clocks: dict[int, GraphClock] = {}
    for r in (0, 1):
        clocks[r] = GraphClock(RankProgram.read(path, r), SharedPort(cosim, r, clocks), wall_ns=wall)
    return clocks


def tp_call(clock: GraphClock, at: int, got: dict) -> None:
    call = PendingCall(op="all_reduce", group="0", label="tp.0", group_size=2, gseq=0, bytes=32, peer=None, enter_ns=at)  # fmt: skip
    clock.submit(call, lambda done, rank=clock.rank: got.__setitem__(rank, done))


def test_a_mixed_collective_of_two_real_ranks_ends_after_the_later_one(tmp_path: Path) -> None:
    graph, path = tp_pair(tmp_path)
    wall = FakeWall()
    clocks, got = two_real(path, graph, wall), {}
    for clock in clocks.values():
        clock.iteration_started(ORIGIN)
    wall.now = ORIGIN + 100
    tp_call(clocks[0], ORIGIN + 100, got)  # rank 0 waits: its peer is real and not there yet
    assert got == {}
    wall.now = ORIGIN + 300
    tp_call(clocks[1], ORIGIN + 300, got)
    assert got == {0: ORIGIN + 350, 1: ORIGIN + 350}  # both end 50 after the later arrival
    assert clocks[0].iterations[0].stall_ns == 0  # named exactly when it was due for rank 0


def test_a_rank_a_pass_ahead_waits_only_for_the_real_rank_it_meets(tmp_path: Path) -> None:
    graph, path = tp_pair(tmp_path)
    wall = FakeWall()
    clocks, got = two_real(path, graph, wall), {}
    cosim = clocks[0].port.cosim
    for clock in clocks.values():
        clock.iteration_started(ORIGIN)
    wall.now = ORIGIN + 300
    tp_call(clocks[0], ORIGIN + 100, got)
    tp_call(clocks[1], ORIGIN + 300, got)
    clocks[1].iteration_done(ORIGIN + 360)
    clocks[1].iteration_started(ORIGIN + 360)  # rank 1 begins iteration 2 while rank 0 is in 1
    tp_call(clocks[1], ORIGIN + 660, got)
    assert got[1] == ORIGIN + 350  # its new call waits for rank 0, still in iteration 1
    # Both real ranks were past their last call: the pass was finished for the virtual side then,
    # and each real rank's own iteration is filled in at its end.
    assert len(cosim.pass_iterations) == 1 and cosim.pass_iterations[0][0] != 360
    clocks[0].iteration_done(ORIGIN + 360)
    assert list(cosim.pass_iterations[0]) == [360, 360]
    assert [p.rank_end_ns for p in cosim.passes[1]] == [360, 0]
    clocks[0].iteration_started(ORIGIN + 360)
    tp_call(clocks[0], ORIGIN + 460, got)
    assert got == {0: ORIGIN + 710, 1: ORIGIN + 710}


def test_real_ranks_that_all_wait_for_each_other_are_a_deadlock(tmp_path: Path) -> None:
    programs = named(
        [
            [{gf.KIND: "recv", gf.PEER: 1, gf.P2P_SEQ: 0}, {gf.KIND: "send", gf.PEER: 1, gf.P2P_SEQ: 0}],
            [{gf.KIND: "recv", gf.PEER: 0, gf.P2P_SEQ: 0}, {gf.KIND: "send", gf.PEER: 0, gf.P2P_SEQ: 0}],
        ]
    )  # fmt: skip
    path = write(tmp_path / "g.parquet", config(tp=2), programs)
    clocks = two_real(path, load_sim_graph(path), FakeWall())
    for clock in clocks.values():
        clock.iteration_started(ORIGIN)
    recv = dict(op="recv", group="0", label="world", group_size=2, gseq=0, bytes=64, enter_ns=ORIGIN)
    clocks[0].submit(PendingCall(**recv, peer=1), lambda _: None)  # one waits: not yet a deadlock
    with pytest.raises(DivergenceError, match="can never complete.*the real ranks have not done"):
        clocks[1].submit(PendingCall(**recv, peer=0), lambda _: None)


@pytest.mark.parametrize("ahead", [False, True])
def test_an_async_end_found_by_deferred_work_reaches_the_waiting_program(tmp_path: Path, ahead: bool) -> None:
    # Rank 0 posts a recv, then meets rank 1 in a collective; rank 1 sends only after it. With
    # ``ahead``, the collective is answered at once and the advance that lets the virtual
    # rank 1 send is done after it, which must name the recv's end to the waiting program.
    recv = {gf.KIND: "recv", gf.PEER: 1, gf.P2P_SEQ: 0, gf.IS_ASYNC: True, gf.DUR_NS: 7}
    send = {gf.KIND: "send", gf.PEER: 0, gf.P2P_SEQ: 0, gf.IS_ASYNC: True, gf.DUR_NS: 7}
    programs = named(
        [
            [recv, collective(1, 5, 2, **{gf.GROUP_INDEX: 0}), compute(0, **{gf.DEPS: [0]}), compute(3)],
            [compute(20), collective(1, 5, 2, **{gf.GROUP_INDEX: 0}), send, compute(0, **{gf.DEPS: [2]})],
        ]
    )  # fmt: skip
    path = write(tmp_path / "g.parquet", config(tp=2), programs)
    graph = load_sim_graph(path)
    clock, done = played(path, graph, 0, iterations=2, ahead=ahead)
    expected = simulate(graph, iterations=2)
    assert done[-1][0] - ORIGIN == expected.end_ns[0] == expected.end_ns[1] + 7  # sent after the collective
    assert [p.rank_end_ns - p.rank_start_ns for p in clock.cosim.passes[0]][-1] == expected.iteration_ns[0]
