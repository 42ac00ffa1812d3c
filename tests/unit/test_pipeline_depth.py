"""A pipeline stage at another depth: the schedule read from the captured stages, and a stage's
warm-up moved so that it runs the steps a stage at the target's place runs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.layer_passes import ORIGIN
from prism.graph.build.microbatch_steps import microbatch_steps
from prism.graph.build.pipeline_depth import (
    GPIPE,
    ONE_F_ONE_B,
    change_warmup,
    schedule_kind,
    target_warmup,
    warmup_forwards,
)
from prism.graph.build.program_graph import _captured_layers
from prism.graph.build.templates import TemplateError
from prism.schemas.held_parameters import HeldParameters

ACTIVATION = 100  # what a forward allocates and its backward frees


def _unit(name: str, phase: str, *, alloc: int = 0, free: int = 0, comm: str = "") -> dict:
    return {
        ot.NAME: name, ot.PHASE: phase, ot.IS_COMM: bool(comm), ot.COMM_OP: comm, ot.GROUP_LABEL: "",
        ot.BYTES: 1024 if comm else -1, ot.ALLOC_BYTES: alloc, ot.FREE_BYTES: free, ot.PEER: 1 if comm else -1,
    }  # fmt: skip


def _order(schedule: str, stage: int, stages: int, microbatches: int) -> list[str]:
    if schedule == GPIPE:
        return ["F"] * microbatches + ["B"] * microbatches
    warmup = min(stages - stage - 1, microbatches)
    return ["F"] * warmup + ["F", "B"] * (microbatches - warmup) + ["B"] * warmup


def _iteration(schedule: str, stage: int, stages: int, microbatches: int = 8) -> pd.DataFrame:
    """A middle stage's iteration: a receive, forward and send a forward step; a backward and
    send a backward step; the first backward also allocates the gradients (what later ones find)."""
    units = [_unit("aten::randint", "iter")]
    first_backward = True
    for kind in _order(schedule, stage, stages, microbatches):
        if kind == "F":
            units += [_unit("recv", "iter", comm="recv"), _unit("aten::linear", "fwd", alloc=ACTIVATION)]
            units.append(_unit("send", "iter", comm="send"))
        else:
            grads = 64 if first_backward else 0
            units.append(_unit("AddmmBackward0", "bwd", alloc=grads, free=ACTIVATION))
            units.append(_unit("send", "iter", comm="send"))
            first_backward = False
    units.append(_unit("aten::add_", "optim"))
    return pd.DataFrame(units)


def _shape(units: pd.DataFrame) -> list[tuple]:
    return list(units[[ot.NAME, ot.PHASE, ot.ALLOC_BYTES, ot.FREE_BYTES]].itertuples(index=False, name=None))


def _warmup(units: pd.DataFrame) -> int:
    return warmup_forwards(microbatch_steps(units))


def test_the_warmup_is_the_forwards_before_the_first_backwards_pair() -> None:
    assert [_warmup(_iteration(ONE_F_ONE_B, s, 4)) for s in range(4)] == [3, 2, 1, 0]
    assert _warmup(_iteration(GPIPE, 1, 4)) == 7
    with pytest.raises(TemplateError, match="neither 1F1B's nor GPipe's"):
        _warmup(pd.concat([_iteration(ONE_F_ONE_B, 0, 4).iloc[:-1], _iteration(GPIPE, 0, 4).iloc[1:]]))


def test_the_schedule_is_read_from_every_captured_stage() -> None:
    assert schedule_kind({0: 3, 1: 2, 3: 0}, pp=4, microbatches=8) == ONE_F_ONE_B
    assert schedule_kind({0: 7, 1: 7, 3: 7}, pp=4, microbatches=8) == GPIPE
    with pytest.raises(TemplateError, match="stage 0: 3, stage 1: 1"):
        schedule_kind({0: 3, 1: 1}, pp=4, microbatches=8)
    assert target_warmup(ONE_F_ONE_B, stage=1, pp=8, microbatches=8) == 6
    assert target_warmup(ONE_F_ONE_B, stage=0, pp=12, microbatches=8) == 7
    assert target_warmup(GPIPE, stage=1, pp=8, microbatches=8) == 7


@pytest.mark.parametrize(
    ("captured", "target"), [((0, 4), (0, 6)), ((1, 4), (1, 7)), ((0, 6), (0, 4)), ((1, 4), (5, 6))]
)
def test_a_stage_at_another_place_runs_the_steps_a_stage_there_runs(captured, target) -> None:
    units = _iteration(ONE_F_ONE_B, *captured)
    warmup = _warmup(_iteration(ONE_F_ONE_B, *target))
    moved, _ = change_warmup(units, {}, warmup)
    assert _shape(moved) == _shape(_iteration(ONE_F_ONE_B, *target))
    assert (units.iloc[moved[ORIGIN]].reset_index(drop=True)[ot.NAME] == moved[ot.NAME]).all()
    # The activations a warm-up holds, one a forward before the first backward, and the gradients.
    held = np.cumsum(moved[ot.ALLOC_BYTES] - moved[ot.FREE_BYTES])
    assert held.max() == (warmup + 1) * ACTIVATION + 64


def test_a_call_is_waited_for_where_its_copy_lands() -> None:
    units = _iteration(ONE_F_ONE_B, 0, 4)
    sends = np.flatnonzero(units[ot.COMM_OP] == "send")
    waits = {int(s) + 1: [int(s)] for s in sends}  # each send waited for by the unit after it
    moved, moved_waits = change_warmup(units, waits, 5)
    moved_sends = np.flatnonzero(moved[ot.COMM_OP] == "send")
    assert sorted(c for calls in moved_waits.values() for c in calls) == moved_sends.tolist()
    assert all(at == calls[0] + 1 for at, calls in moved_waits.items())


def test_a_warmup_the_microbatches_cannot_hold_or_nothing_to_copy_is_refused() -> None:
    with pytest.raises(TemplateError, match="0 to 7 warm-up forwards, not 8"):
        change_warmup(_iteration(ONE_F_ONE_B, 0, 4), {}, 8)
    with pytest.raises(TemplateError, match="no warm-up forward step to copy"):
        change_warmup(_iteration(ONE_F_ONE_B, 3, 4), {}, 2)
    gpipe = _iteration(GPIPE, 0, 4)
    assert change_warmup(gpipe, {}, 7)[0] is not None


def _late_free(units: pd.DataFrame, late: int = 10) -> pd.DataFrame:
    """``units`` where the third steady backward frees a buffer of ``late`` bytes a step late: the
    first cool-down backward frees it."""
    units = units.copy()
    backwards = np.flatnonzero(units[ot.PHASE] == "bwd")
    units.loc[backwards[2], ot.FREE_BYTES] -= late
    units.loc[backwards[-4], ot.FREE_BYTES] += late
    return units


def test_steps_that_free_anothers_buffer_stay_and_the_iteration_holds_what_it_held() -> None:
    units = _late_free(_iteration(ONE_F_ONE_B, 0, 4))
    net = units[ot.ALLOC_BYTES].sum() - units[ot.FREE_BYTES].sum()
    for warmup in (1, 5):
        moved, _ = change_warmup(units, {}, warmup)
        assert moved[ot.ALLOC_BYTES].sum() - moved[ot.FREE_BYTES].sum() == net
        assert (moved[ot.FREE_BYTES] == _late_free(_iteration(ONE_F_ONE_B, 0, 4))[ot.FREE_BYTES].max()).any()


def test_a_stage_whose_copies_would_hold_more_than_captured_is_refused() -> None:
    units = _iteration(ONE_F_ONE_B, 0, 4)
    units.loc[0, ot.ALLOC_BYTES] = 21  # drawn before the steps, freed by the cool-down, 7 bytes each
    units.loc[np.flatnonzero(units[ot.PHASE] == "bwd")[-4:-1], ot.FREE_BYTES] += 7
    with pytest.raises(TemplateError, match=r"hold \+14 bytes more in an iteration than captured"):
        change_warmup(units, {}, 1)


def _capture(layers_of_stage: list[tuple[int, ...]]) -> SimpleNamespace:
    """A manifest's view the build reads for the layer share: each captured stage's parameters."""
    ranks = [
        SimpleNamespace(
            stage=stage,
            rank=stage,
            result=SimpleNamespace(
                parameters=HeldParameters(
                    numels=(4,) * len(layers),
                    layers=layers,
                    held_bytes=(16,) * len(layers),
                    itemsize=4,
                    bucket_bytes=0,
                )  # fmt: skip
            ),
        )
        for stage, layers in enumerate(layers_of_stage)
    ]
    pp = len(layers_of_stage)
    return SimpleNamespace(
        ranks=ranks, job=SimpleNamespace(program=SimpleNamespace(layout=SimpleNamespace(pp=pp)))
    )


def test_another_depth_splits_the_captured_layers_and_needs_their_marks() -> None:
    assert _captured_layers(_capture([(-1, 0, 0, 1, 1), (0, 0, 1, 1), (0, 1, -1)])) == 6
    with pytest.raises(TemplateError, match="marks no layer blocks"):
        _captured_layers(_capture([(-1, -1), (-1,), (-1, -1)]))
