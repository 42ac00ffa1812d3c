"""The cold_call table's reach: calibrated up to the job's gaps in bounded time, and a build that
says when the table stops short of its collectives' gaps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prism.graph.build.bind import AXIS_CODES, EncodedProgram
from prism.graph.build.cold_coverage import longest_collective_gap_ns, uncovered_cold_gaps
from prism.graph.build.compose import IDLE
from prism.graph.comm.calibrate import COLD_POINT_BUDGET_S, MIN_COLD_REPS, CalibrationConfig, cold_reps
from prism.schemas.cluster import preset
from prism.schemas.layout import ParallelLayout

MS = 1_000_000


def _program(rows: list[tuple[str | None, int]]) -> EncodedProgram:
    """(axis of a collective, or None for compute or a transfer; compute before it in ns) per node."""
    columns = {
        "is_coll": np.array([axis is not None for axis, _ in rows]),
        "axis_code": np.array([AXIS_CODES.get(axis, 0) for axis, _ in rows], np.int64),
        IDLE: np.array([idle for _, idle in rows], np.int64),
    }
    return EncodedProgram(None, columns, {}, np.zeros(len(rows) + 1, np.int32), np.zeros(0, np.int32))


SPEC = replace(preset("h100-ib"), cold_call={"500": 1e-4, "4000": 5e-4})
DP2 = ParallelLayout(tp=2, pp=1, dp=2)


def test_the_reach_is_the_longest_gap_measured() -> None:
    assert SPEC.cold_reach_s == pytest.approx(4e-3)
    assert preset("h100-ib").cold_reach_s == 0.0
    assert SPEC.cold_extra_s(40e-3) == SPEC.cold_extra_s(4e-3)  # flat past it: why the reach matters


def test_a_gradient_all_reduce_after_a_long_backward_is_out_of_reach() -> None:
    stages = [_program([("tp", 1 * MS), (None, 0), ("dp", 37 * MS)])]
    assert longest_collective_gap_ns(stages, DP2) == 37 * MS
    line = uncovered_cold_gaps(stages, DP2, SPEC)
    assert line is not None
    assert "stops at 4 ms" in line and "up to 37 ms" in line
    assert line.endswith("--cold-gaps-ms 0.5,1,2,4,16,64")


def test_gaps_within_reach_or_on_groups_of_one_say_nothing() -> None:
    short = [_program([("tp", 1 * MS), ("dp", 8 * MS)])]
    assert uncovered_cold_gaps(short, DP2, SPEC) is None  # within twice the last gap
    lone_dp = [_program([("tp", 1 * MS), ("dp", 37 * MS)])]
    assert uncovered_cold_gaps(lone_dp, ParallelLayout(tp=2, pp=1, dp=1), SPEC) is None
    transfer_only = [_program([(None, 50 * MS), ("tp", 1 * MS)])]
    assert uncovered_cold_gaps(transfer_only, DP2, SPEC) is None
    long = [_program([("dp", 37 * MS)])]
    assert uncovered_cold_gaps(long, DP2, preset("h100-ib")) is None  # no table: no cold price at all
    assert uncovered_cold_gaps(long, DP2, replace(SPEC, cold_call={"64000": 1e-3})) is None


def test_long_gaps_are_timed_with_fewer_repetitions_within_a_budget() -> None:
    config = CalibrationConfig(reps=100, cold_gaps_ms=(0.5, 64.0))
    assert cold_reps(0.5, config) == 100  # short gaps keep every repetition
    long = cold_reps(64.0, config)
    assert long == MIN_COLD_REPS or long * 64e-3 * config.calls_per_rep <= COLD_POINT_BUDGET_S
    assert cold_reps(10_000.0, config) == MIN_COLD_REPS
    assert cold_reps(64.0, CalibrationConfig(reps=3, cold_gaps_ms=(64.0,))) == 3  # never more than asked
