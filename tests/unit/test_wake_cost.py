"""Compute after a wait for a late peer pays the spec's wake cost, and only then."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from prism.graph.build.builder import _priced_cluster
from prism.graph.comm.bench import CalibrationError
from prism.graph.comm.wake_bench import run_wake_benchmark, summarise_wake, wake_table
from prism.graph.sim.engine import wake_cost
from prism.graph.sim.load import load_sim_graph, wake_of
from prism.graph.sim.metrics import breakdown
from prism.graph.sim.simulate import simulate
from prism.schemas.cluster import ClusterSpec, ClusterSpecError, preset, wake_points_ns
from prism.schemas.graph_format import NodeKind
from prism.schemas.manifest import PACED_MODE
from tests.unit.test_simulate import collective, compute, config, transfer, write

TABLE = {"1000": 100e-6, "4000": 400e-6}
"""100 µs of extra compute after a 1 ms wait, 400 µs after 4 ms (linear from 0, flat past 4 ms)."""
WAITS, EXTRA = wake_points_ns(TABLE)


def test_the_table_is_read_from_zero_and_flat_past_its_reach() -> None:
    assert list(WAITS) == [0, 1_000_000, 4_000_000]
    assert wake_cost(2_000_000, 2_000_000, WAITS, EXTRA) == 200_000
    assert wake_cost(9_000_000, 9_000_000, WAITS, EXTRA) == 400_000  # flat past 4 ms


def test_only_the_part_of_a_wait_spent_on_late_peers_costs() -> None:
    # 3 ms waited, 1 ms of it the call's own time (the capture waited that long too):
    # table(3 ms) - table(1 ms) = 300 - 100 µs.
    assert wake_cost(3_000_000, 2_000_000, WAITS, EXTRA) == 200_000
    assert wake_cost(3_000_000, 0, WAITS, EXTRA) == 0
    assert wake_cost(3_000_000, 2_000_000, np.zeros(0), np.zeros(0)) == 0  # no table


def _pipeline(tmp_path: Path, *, table: dict | None):
    """Rank 1 computes 3 ms before it sends; rank 0 posts its receive at once and waits for it."""
    cfg = config(pp=2)
    programs = [
        [transfer(NodeKind.RECV, 1, 0, 10_000), compute(500_000, **{"deps": [0]}), compute(100_000)],
        [compute(3_000_000), transfer(NodeKind.SEND, 0, 0, 10_000), compute(100_000)],
    ]
    graph = load_sim_graph(write(tmp_path / "g.parquet", cfg, programs))
    if table is not None:
        graph = dataclasses.replace(graph, wake_ns=wake_points_ns(table))
    return graph


def test_a_stage_that_waited_for_its_neighbour_computes_slower_after_it(tmp_path: Path) -> None:
    plain = simulate(_pipeline(tmp_path, table=None), iterations=1)
    graph = _pipeline(tmp_path, table=TABLE)
    woken = simulate(graph, iterations=1)
    # Rank 0 waits from 0 to 3.01 ms, all of it but the transfer's own 10 µs for its late neighbour.
    extra = round(np.interp(3_010_000, WAITS, EXTRA) - np.interp(10_000, WAITS, EXTRA))
    first = 1  # rank 0's compute after the wait pays it, once
    assert woken.end_ns[first] - woken.start_ns[first] == 500_000 + extra
    assert woken.end_ns[first + 1] - woken.start_ns[first + 1] == 100_000
    assert woken.iteration_ns[0] == plain.iteration_ns[0] + extra
    assert woken.iteration_ns[1] == plain.iteration_ns[1]  # the sender never waited
    # The cost is compute: the breakdown still adds up to the iteration.
    split = breakdown(graph, woken)
    parts = split.compute_ns + split.overhead_ns + split.exposed_comm_ns + split.bubble_ns
    assert list(parts) == list(woken.iteration_ns)
    assert split.compute_ns[0] == 600_000 + extra


def test_members_that_arrive_together_pay_nothing(tmp_path: Path) -> None:
    cfg = config(tp=2)
    programs = [[compute(1_000_000), collective(7, 2_000_000, 2), compute(100_000)]] * 2
    graph = load_sim_graph(write(tmp_path / "g.parquet", cfg, programs))
    woken = simulate(dataclasses.replace(graph, wake_ns=wake_points_ns(TABLE)), iterations=2)
    assert list(woken.iteration_ns) == list(simulate(graph, iterations=2).iteration_ns)


def test_the_early_member_of_a_collective_pays_for_the_late_one(tmp_path: Path) -> None:
    cfg = config(tp=2)
    programs = [
        [compute(1_000_000), collective(7, 50_000, 2), compute(100_000)],
        [compute(3_000_000), collective(7, 50_000, 2), compute(100_000)],
    ]
    graph = dataclasses.replace(
        load_sim_graph(write(tmp_path / "g.parquet", cfg, programs)), wake_ns=wake_points_ns(TABLE)
    )
    result = simulate(graph, iterations=1)
    spans = result.end_ns - result.start_ns
    assert spans[2] == 100_000 + 200_000  # waited 2 ms for rank 1: table(2.05 ms) - table(0.05 ms)
    assert spans[5] == 100_000


def test_a_graph_takes_the_table_of_its_cluster_spec(tmp_path: Path) -> None:
    cfg = config(tp=2)
    path = write(tmp_path / "g.parquet", cfg, [[compute(10)], [compute(10)]])
    assert load_sim_graph(path).wake_ns is None  # a spec without the table: no wake cost
    spec = dataclasses.replace(preset("h100-ib"), wake_compute=TABLE)
    assert ClusterSpec.from_toml(spec.to_toml()).wake_compute == spec.wake_compute
    waits, extra = wake_of(spec.to_dict())  # as load_sim_graph reads it from the graph's metadata
    assert list(waits) == list(WAITS) and list(extra) == list(EXTRA)


def test_a_bad_wake_table_is_refused() -> None:
    with pytest.raises(ClusterSpecError, match="wake_compute keys are whole microseconds"):
        dataclasses.replace(preset("h100-ib"), wake_compute={"1.5": 0.001})


def test_the_benchmark_rows_give_extra_time_over_back_to_back_by_wait() -> None:
    rows = [(-1, 0, 1000_000), (-1, 0, 1010_000), (-1, 0, 990_000)]
    rows += [(1, 4_100_000, 1_400_000), (1, 4_300_000, 1_300_000), (0, 1_100_000, 1_050_000)]
    samples = summarise_wake(rows, rounds=3)
    assert [round(s.wait_s * 1e6) for s in samples] == [1100, 4200]
    assert [round(s.extra_s * 1e6) for s in samples] == [50, 350]
    assert wake_table(samples) == {"1100": pytest.approx(50e-6), "4200": pytest.approx(350e-6)}
    with pytest.raises(CalibrationError, match="back-to-back"):
        summarise_wake([(0, 1_000, 1_000)], rounds=1)


@pytest.mark.slow
def test_the_benchmark_times_compute_after_real_gloo_waits() -> None:
    samples = run_wake_benchmark(gaps_ms=(0.5, 4.0), rounds=3, warmup=1, timeout_s=120)
    assert len(samples) == 2
    # Each wait is at least what the neighbour was told to compute, and not far beyond.
    assert 0.5e-3 <= samples[0].wait_s < samples[1].wait_s < 0.1
    assert samples[1].wait_s >= 4e-3
    assert all(s.units_s > 0 for s in samples)


def test_a_paced_capture_s_graph_is_priced_without_the_table() -> None:
    # Its compute already ran after the job's waits: charging them again would count them twice.
    spec = dataclasses.replace(preset("h100-ib"), wake_compute=TABLE)
    assert _priced_cluster(spec, SimpleNamespace(mode=PACED_MODE))["wake_compute"] == {}
    assert _priced_cluster(spec, SimpleNamespace(mode="roles"))["wake_compute"] == TABLE
