"""Loops over parameters at another layer count: each target parameter runs its source's units,
and every byte the loop frees is freed once, where it belongs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.parameter_loops import optimizer_step, per_parameter_glue
from prism.graph.build.templates import TemplateError

SIZES = (64, 4, 32, 8, 16)
"""Bytes of each captured parameter's temporaries."""


def _frame(rows: list[tuple[str, str, int, int]]) -> pd.DataFrame:
    """Units (name, phase, alloc, free), each its own captured position (``origin``)."""
    names, phases, alloc, free = zip(*rows, strict=True)
    return pd.DataFrame(
        {ot.NAME: names, ot.PHASE: phases, ot.ALLOC_BYTES: alloc, ot.FREE_BYTES: free,
         ot.DUR_NS: 10, ot.GAP_NS: 1, "origin": np.arange(len(rows))}
    )  # fmt: skip


def _balance(units: pd.DataFrame) -> int:
    return int(units[ot.ALLOC_BYTES].sum() - units[ot.FREE_BYTES].sum())


def _optimizer(sizes: tuple[int, ...]) -> pd.DataFrame:
    """A for-loop step: each parameter's group allocates its temporary and frees the one before
    (the first frees nothing; the unit after the loop frees the last)."""
    rows = [("backward", "bwd", 0, 0)]
    for i, size in enumerate(sizes):
        rows += [("aten::mul_", "optim", size, 0), ("aten::add_", "optim", 0, sizes[i - 1] if i else 0)]
    return _frame(rows + [("zero_grad", "iter", 0, sizes[-1])])


def _lag(units: pd.DataFrame, groups: np.ndarray) -> np.ndarray:
    """What each group's units free of the group before's blocks, as address tracing finds it:
    here all a group frees."""
    free = units[ot.FREE_BYTES].to_numpy()[groups].copy()
    free[0] = 0
    return free


def test_a_for_loop_steps_each_target_parameter_freeing_its_predecessors_temporaries() -> None:
    units = _optimizer(SIZES)
    in_step = (units[ot.PHASE] == "optim").to_numpy()
    sources = (0, 1, 2, 1, 2, 3, 4)  # two parameters more, copies of the middle ones
    stepped = optimizer_step(units, in_step, sources, SIZES, traced=_lag)
    frees = stepped[ot.FREE_BYTES].to_numpy()[2:-1:2]
    # Each target group frees what the one before it allocated, as a capture of 7 would.
    target = [SIZES[s] for s in sources]
    assert frees.tolist() == [0, *target[:-1]]
    assert _balance(stepped.iloc[:-1]) == target[-1]  # left for the unit after the loop
    # Without the trace each copy frees what its source freed: a temporary of the wrong size.
    copied = optimizer_step(units, in_step, sources, SIZES)
    assert copied[ot.FREE_BYTES].to_numpy()[2:-1:2].tolist() != frees.tolist()


def _scaled_gradients(state: int) -> pd.DataFrame:
    """A pipeline schedule scaling each gradient in place, then dropping its per-microbatch
    ``state`` in the gap after the last (given to the last unit), then the optimizer."""
    rows = [("backward", "bwd", 0, 0)]
    rows += [("aten::div_", "iter", 4, 4 + (state if i == len(SIZES) - 1 else 0)) for i in range(len(SIZES))]
    return _frame(rows + [("aten::add_", "optim", 0, 0)])


def test_a_free_of_the_loop_is_freed_once_at_its_place_however_many_parameters_copy_its_unit() -> None:
    units = _scaled_gradients(state=1000)
    glue = (units[ot.PHASE] == "iter").to_numpy()
    for sources in [(0, 1, 2, 3, 2, 3, 4), (0, 1, 2, 3), (0, 1, 4)]:
        out = per_parameter_glue(units, glue, sources, len(SIZES))
        frees = out[ot.FREE_BYTES].to_numpy()[1:-1]
        assert len(frees) == len(sources)
        assert frees.tolist() == [4] * (len(sources) - 1) + [1004]
        assert _balance(out) == _balance(units) == -1000  # the state, freed once


def test_a_loop_without_odd_frees_is_copied_unit_by_unit() -> None:
    units = _scaled_gradients(state=0)
    glue = (units[ot.PHASE] == "iter").to_numpy()
    out = per_parameter_glue(units, glue, (0, 1, 1, 2, 3, 4), len(SIZES))
    assert out[ot.NAME].tolist() == ["backward"] + ["aten::div_"] * 6 + ["aten::add_"]
    assert out["origin"].tolist() == [0, 1, 2, 2, 3, 4, 5, 6]
    assert _balance(out) == 0


def test_a_loop_freeing_what_each_unit_replaces_frees_it_with_each_copy() -> None:
    """Gradients divided out of place: each unit allocates its parameter's new gradient and frees
    the old one, of sizes that differ by parameter; no free of it is the loop's."""
    rows = [("backward", "bwd", 0, 0)] + [("aten::div", "iter", size, size) for size in SIZES]
    units = _frame(rows + [("aten::add_", "optim", 0, 0)])
    glue = (units[ot.PHASE] == "iter").to_numpy()
    sources = (0, 1, 2, 3, 2, 3, 4)
    out = per_parameter_glue(units, glue, sources, len(SIZES))
    assert out[ot.FREE_BYTES].to_numpy()[1:-1].tolist() == [SIZES[s] for s in sources]
    assert _balance(out) == 0


def test_a_loop_over_one_of_several_stages_parameters_runs_for_that_stages_targets() -> None:
    # Two stages on a rank, 2 and 3 parameters: a loop of 3 units after stage 1's pass is stage
    # 1's; a loop as long as two stages' parameters with neither's pass before it is refused.
    rows = [("backward", "bwd", 0, 0)] + [("aten::div_", "iter", 4, 4)] * 3 + [("aten::add_", "optim", 0, 0)]
    units = _frame(rows).assign(**{ot.STAGE: [1, -1, -1, -1, -1]})
    glue = (units[ot.PHASE] == "iter").to_numpy()
    sources, stages = (0, 1, 2, 3, 3, 4), (0, 0, 1, 1, 1)
    out = per_parameter_glue(units, glue, sources, len(SIZES), stages=stages)
    assert out["origin"].tolist() == [0, 1, 2, 2, 3, 4]  # stage 1's targets copy its 2nd, 2nd, 3rd
    even = _frame(rows[:3] + rows[-1:]).assign(**{ot.STAGE: -1})
    with pytest.raises(TemplateError, match="of which is not known"):
        per_parameter_glue(even, (even[ot.PHASE] == "iter").to_numpy(), (0, 1, 2, 3), 4, stages=(0, 0, 1, 1))
