"""Arrival skew of collectives: the order statistic, the noise estimate and the intervals."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
from test_compose import CAPTURED, compose, template

from prism.graph.build import op_table as ot
from prism.graph.build.compose import DEPS, GROUP_AXIS, IS_WAIT, OVERLAP, P2P_DIR, SKEW
from prism.graph.sim.noise import (
    call_jitter_ns,
    collective_skew_ns,
    expected_max_normal,
    iteration_cv,
    work_between,
    work_in_flight,
)
from prism.schemas.iterations import STEADY_CLEAN


def test_expected_maximum_of_normals() -> None:
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-4)
    rng = np.random.default_rng(0)
    assert expected_max_normal(64) == pytest.approx(
        rng.standard_normal((20000, 64)).max(axis=1).mean(), abs=0.02
    )


def test_cv_needs_three_clean_iterations() -> None:
    assert iteration_cv((900, 200, 300, 999), warmup=3) == 0.0  # one clean iteration
    cv = iteration_cv((900, 200, 300, 250, 999, 500), warmup=5)
    assert cv == pytest.approx(np.std([200, 300, 250], ddof=1) / 250)


def test_skew_grows_with_the_work_since_the_group_last_met() -> None:
    # compute 100, tp coll, compute 300, tp coll, dp coll, compute 50 (one iteration, repeated)
    work = np.array([100, 0, 300, 0, 0, 50])
    own = np.array([100, 0, 300, 0, 0, 50])
    axis = np.array(["", "tp", "", "tp", "dp", ""])
    skew = collective_skew_ns(work, own, axis, {"tp": 2, "dp": 8}, cv=0.1)
    e2, e8 = expected_max_normal(2), expected_max_normal(8)
    # The first tp collective looks back over the iteration's end: 50 + 100 of work.
    assert list(skew) == [0, round(e2 * 0.1 * 150), 0, round(e2 * 0.1 * 300), round(e8 * 0.1 * 450), 0]
    assert not collective_skew_ns(work, own, axis, {"tp": 2, "dp": 8}, cv=0.0).any()
    assert not collective_skew_ns(work, own, axis, {"tp": 1, "dp": 1}, cv=0.1).any()


def test_a_per_call_noise_floor_adds_to_the_interval_noise() -> None:
    work = np.array([100, 0, 300, 0])
    axis = np.array(["", "tp", "", "tp"])
    skew = collective_skew_ns(work, work * 1, axis, {"tp": 2}, cv=0.1, jitter_ns=40.0)
    e2 = expected_max_normal(2)
    assert list(skew) == [0, round(e2 * math.hypot(0.1 * 100, 40)), 0, round(e2 * math.hypot(0.1 * 300, 40))]
    only_jitter = collective_skew_ns(work, work * 1, axis, {"tp": 2}, cv=0.0, jitter_ns=40.0)
    assert list(only_jitter) == [0, round(e2 * 40), 0, round(e2 * 40)]


def test_call_jitter_is_the_spread_of_each_position_across_clean_iterations() -> None:
    # 2 set-up calls, then 7 iterations of 3 calls (warm-up 5: iterations 1-3 are clean).
    rng = np.random.default_rng(1)
    idle = np.array([1000.0, 2000.0, 500.0])  # before each call of an iteration
    noise = rng.normal(0, 50, (7, 3))
    noise[:, 0] = rng.normal(0, 5000, 7)  # the boundary-spanning interval: left out
    noise[[0, 4, 5, 6], 1:] *= 40  # cold and profiled iterations: left out
    entry, exit_, t = [], [], 0.0
    for _ in range(2):  # set-up
        entry.append(t), exit_.append(t + 10)
        t += 10_000
    for it in range(7):
        for pos in range(3):
            t += idle[pos] + noise[it, pos]
            entry.append(t), exit_.append(t + 300)
            t += 300
    jitter = call_jitter_ns(np.array(entry), np.array(exit_), per_iteration=3, total_iterations=7, warmup=5)
    clean = noise[1:4, 1:]
    assert jitter == pytest.approx(np.sqrt(np.median(clean.var(axis=0, ddof=1))))
    assert 0 < jitter < 200
    # Too few clean iterations, or calls that do not fill the iterations: unknown, so 0.
    assert call_jitter_ns(np.array(entry), np.array(exit_), 3, 7, warmup=3) == 0.0
    assert call_jitter_ns(np.array(entry), np.array(exit_), 4, 7, warmup=5) == 0.0


def test_composed_programs_skew_only_their_collectives() -> None:
    noisy = template(1)
    noisy = type(noisy)(**{**noisy.__dict__, "noise_cv": 0.05})
    nodes = compose(noisy, cfg=CAPTURED, captured=CAPTURED, stage=1).nodes
    is_coll = nodes[ot.IS_COMM].to_numpy(dtype=bool) & (nodes[P2P_DIR].to_numpy() == 0)
    assert (nodes.loc[is_coll, SKEW] > 0).all() and (nodes.loc[~is_coll, SKEW] == 0).all()
    dp = nodes[is_coll & (nodes[GROUP_AXIS] == "dp").to_numpy()]
    tp = nodes[is_coll & (nodes[GROUP_AXIS] == "tp").to_numpy()]
    assert dp[SKEW].iloc[0] > tp[SKEW].max()  # a whole iteration since the last gradient sync
    quiet = compose(template(1), cfg=CAPTURED, captured=CAPTURED, stage=1).nodes
    assert (quiet[SKEW] == 0).all()


def _csr(deps: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    return np.cumsum([0] + [len(d) for d in deps]), np.array([i for d in deps for i in d], np.int64)


def test_work_in_flight_is_what_the_rank_does_between_a_call_and_its_wait() -> None:
    # Lane 0: call 0 (async), compute 1-2, wait 3 on 0; call 4, never waited for.
    # Lane 1: compute 5, wait 6 on lane 0's call 0 (another lane's node: not its wait).
    own = np.array([0, 100, 200, 0, 0, 50, 0])
    gap = np.array([0, 10, 20, 30, 0, 5, 0])
    ptr, flat = _csr([[], [], [], [0], [], [], [0]])
    got = work_in_flight(own, gap, np.array([0, 4]), ptr, flat, rank_ptr=np.array([0, 5, 7]))
    assert got.tolist() == [100 + 10 + 200 + 20 + 30, 0]
    # One lane: lane 1's wait is now the only later dependent after lane 0's own wait.
    assert work_in_flight(own, gap, np.array([0]), ptr, flat).tolist() == [360]
    assert work_in_flight(own, gap, np.array([], np.int64), ptr, flat).tolist() == []


def test_composed_async_calls_carry_the_compute_they_fly_beside() -> None:
    nodes = compose(template(1), cfg=CAPTURED, captured=CAPTURED, stage=1).nodes
    is_async = nodes[ot.IS_COMM].to_numpy(dtype=bool) & nodes[ot.IS_ASYNC].to_numpy(dtype=bool)
    assert is_async.any() and (nodes.loc[~is_async, OVERLAP] == 0).all()
    own = np.where(nodes[ot.IS_COMM], 0, nodes[ot.DUR_NS]) + nodes[ot.GAP_NS].to_numpy()
    for call in np.flatnonzero(is_async):
        wait = next(
            i for i in range(call + 1, len(nodes)) if nodes[IS_WAIT].iat[i] and call in nodes[DEPS].iat[i]
        )
        assert nodes[OVERLAP].iat[call] == own[call + 1 : wait].sum() + nodes[ot.GAP_NS].iat[wait]
    assert (nodes.loc[is_async, OVERLAP] > 0).any()


def test_graph_wide_intervals_equal_each_programs_own() -> None:
    from pathlib import Path

    from prism.graph.sim.engine import COMPUTE
    from prism.graph.sim.load import load_sim_graph

    graph = load_sim_graph(Path(__file__).parents[1] / "data" / "tiny_graph.parquet")
    comm = graph.kind != COMPUTE
    own = np.where(comm, 0, graph.dur)
    work = own + graph.gap
    rows = np.flatnonzero(comm)
    idle = np.zeros(len(comm))
    idle[rows] = work_between(work, own, rows, graph.rank_ptr)
    for rank in range(graph.ranks):
        lo, hi = graph.rank_ptr[rank], graph.rank_ptr[rank + 1]
        local = np.flatnonzero(comm[lo:hi])
        assert (idle[lo:hi][local] == work_between(work[lo:hi], own[lo:hi], local)).all()
        # By hand: the work from the previous comm node's arrival to this one's.
        arrival = np.cumsum(work[lo:hi]) - own[lo:hi]
        assert (idle[lo:hi][local[1:]] == np.diff(arrival[local])).all()
        assert idle[lo + local[0]] == arrival[local[0]] + work[lo:hi].sum() - arrival[local[-1]]
    assert (idle[comm] > 0).all()


def test_the_build_warns_only_of_a_noise_estimate_that_rests_on_few_iterations() -> None:
    from prism.graph.build.cli import _unsteady_noise

    def role(rank: int, cv: float, clean: int) -> dict:
        return {"rank": rank, "noise_cv": cv, "clean_iterations": clean}

    assert _unsteady_noise({"first": role(0, 0.258, STEADY_CLEAN)}) is None
    assert _unsteady_noise({"first": role(0, 0.0, 3)}) is None  # no noise measured: no skew from it
    warning = _unsteady_noise({"first": role(0, 0.258, 3), "last": role(7680, 0.06, 10)})
    assert warning is not None and "rank(s) 0 rests on 3 clean" in warning and "7680" not in warning


def test_the_build_warns_of_a_capture_whose_unprofiled_iterations_ran_on_a_busy_machine() -> None:
    from prism.graph.build.cli import NOISY_CV, _noisy_capture

    def role(rank: int, cv: float) -> dict:
        return {"rank": rank, "noise_cv": cv, "clean_iterations": 10}

    assert _noisy_capture({"first": role(0, 0.037)}) is None
    assert _noisy_capture(None) is None
    warning = _noisy_capture({"first": role(0, NOISY_CV + 0.01), "last": role(7680, 0.26)})
    assert warning is not None and "rank 7680 varied by 26 %" in warning and "2 rank(s)" in warning


def test_the_commands_default_warm_up_leaves_a_steady_noise_estimate() -> None:
    from prism.capture.cli import capture
    from prism.replay.cli import replay
    from prism.schemas.iterations import DEFAULT_WARMUP, clean_unprofiled

    # The cold first iteration and the profiler's warm-up step are not clean.
    assert len(clean_unprofiled(range(DEFAULT_WARMUP + 2), DEFAULT_WARMUP)) == STEADY_CLEAN
    for command in (capture, replay):
        assert inspect.signature(command).parameters["warmup"].default == DEFAULT_WARMUP
