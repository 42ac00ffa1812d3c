"""A program's profiler correction: each unit scaled by its phase as the capture's timer counts it."""

from __future__ import annotations

import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.profiler_overhead import TimeScale
from prism.graph.build.program_stage import fitted_scale, timed_kinds
from prism.schemas.annotations import GLUE

MS = 1_000_000


def iteration(index: int, rows: list[tuple[str, str, int, int]]) -> pd.DataFrame:
    """Units (name, phase, dur ms, gap ms) of profiled iteration ``index``, none of them a call."""
    return pd.DataFrame(
        [
            {
                ot.ITERATION: index,
                ot.NAME: name,
                ot.PHASE: phase,
                ot.IS_COMM: False,
                ot.COMM_OP: "",
                ot.GROUP_LABEL: "",
                ot.BYTES: 0,
                ot.PEER: -1,
                ot.DUR_NS: dur * MS,
                ot.GAP_NS: gap * MS,
            }  # fmt: skip
            for name, phase, dur, gap in rows
        ]
    )


def step(loss_ms: int) -> list[tuple[str, str, int, int]]:
    return [
        ("aten::zero_", "iter", 1, 1),  # zero_grad, before the first block: glue
        ("aten::linear", "fwd", 4, 0),
        ("aten::mse_loss", "iter", loss_ms, 0),  # between forward and backward: the timer's backward
        ("autograd::engine::evaluate_function: AddmmBackward0", "bwd", 8, 0),
        ("aten::add_", "optim", 2, 0),
        ("aten::item", "iter", 0, 1),  # after the last block: glue
    ]


def test_units_between_blocks_are_the_next_blocks_and_the_ends_glue() -> None:
    units = iteration(0, step(2))
    assert timed_kinds(units) == [None, "fwd", "bwd", "bwd", "optim", None]
    assert timed_kinds(units.assign(**{ot.PHASE: "iter"})) == [None] * 6  # no block at all


def test_a_programs_phases_are_scaled_to_the_timers_unprofiled_times_of_them() -> None:
    ops = pd.concat([iteration(5, step(2)), iteration(6, step(4))], ignore_index=True)  # loss: 3 ms mean
    unprofiled = {"fwd": 2 * MS, "bwd": 5.5 * MS, "optim": 1 * MS, GLUE: 1.5 * MS}
    scale = TimeScale(
        rank=0, unprofiled_ns=10 * MS, profiled_ns=20 * MS, clean_iterations=3,
        phase_factors=dict.fromkeys(unprofiled, 0.5), phase_unprofiled_ns=unprofiled,
    )  # fmt: skip
    fitted = fitted_scale(ops, scale)
    # Backward holds its 8 ms and the loss's 3 between the blocks; glue 1 + 1 before and 1 after.
    assert fitted.factor_of("bwd") == pytest.approx(5.5 / 11)
    assert fitted.factor_of(None) == pytest.approx(1.5 / 3)
    assert fitted.factor_of("fwd") == pytest.approx(2 / 4)
    assert fitted.factor_of("optim") == pytest.approx(1 / 2)
