"""A program's iteration at another microbatch count: its steps, the periods that repeat, their
repetition, and the memory the iteration's own units free or the stage holds for each microbatch."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.layer_passes import ORIGIN
from prism.graph.build.microbatch_steps import (
    MicrobatchTarget,
    expand_microbatches,
    microbatch_notes,
    microbatch_steps,
    persistent_receive_bytes,
    retarget_microbatches,
    schedule_of,
)
from prism.graph.build.templates import TemplateError

KEPT = 8  # what each microbatch's loss keeps past its steps


def _unit(name: str, phase: str, *, alloc: int = 0, free: int = 0, comm: str = "", buffer: int = 0) -> dict:
    return {
        ot.NAME: name, ot.PHASE: phase, ot.IS_COMM: bool(comm), ot.COMM_OP: comm,
        ot.GROUP_LABEL: "", ot.BYTES: 1024 if comm else -1, ot.ALLOC_BYTES: alloc, ot.FREE_BYTES: free,
        ot.PEER: 1 if comm else -1, ot.BUFFER: buffer,
    }  # fmt: skip


def _order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """(pass, microbatch) in the order a stage runs them."""
    if schedule == "GPipe":
        return [("F", m) for m in range(microbatches)] + [("B", m) for m in range(microbatches)]
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        order += [("F", warmup + m), ("B", m)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]


def _iteration(
    schedule: str, stage: int, microbatches: int, stages: int = 2, merge_at_start: bool = False
) -> pd.DataFrame:
    """One iteration of a stage: the batch drawn whole, a step per pass (the last stage's forward
    keeps its loss until the outputs are merged), the optimizer. The first stage receives each
    microbatch's gradient into a buffer of its own, held across iterations."""
    last = stage == stages - 1
    units = [_unit("aten::randint", "iter", alloc=432), _unit("aten::slice", "iter", free=432)]
    if merge_at_start:  # the outputs of the iteration before are dropped as this one begins
        units.append(_unit("aten::merge", "iter", free=KEPT * microbatches))
    for kind, m in _order(schedule, stage, stages, microbatches):
        if kind == "F":
            if stage:
                units.append(_unit("recv", "iter", comm="recv"))
            units.append(_unit("aten::linear", "fwd", alloc=100))
            units.append(_unit("loss", "iter", alloc=KEPT) if last else _unit("send", "iter", comm="send"))
        else:
            units.append(_unit("AddmmBackward0", "bwd", free=100))
            units.append(
                _unit("send", "iter", comm="send")
                if stage
                else _unit("recv", "iter", comm="recv", buffer=7000 + m)
            )
    if last and not merge_at_start:
        units.append(_unit("aten::merge", "iter", free=KEPT * microbatches))
    units.append(_unit("aten::add_", "optim"))
    return pd.DataFrame(units)


def _shape(units: pd.DataFrame) -> list[tuple]:
    return list(units[[ot.NAME, ot.PHASE, ot.COMM_OP, ot.ALLOC_BYTES]].itertuples(index=False, name=None))


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("target", [8, 11, 4])
def test_a_schedule_at_another_microbatch_count_runs_as_if_captured_there(
    schedule: str, stage: int, target: int
) -> None:
    captured = _iteration(schedule, stage, 6)
    read = schedule_of(captured)
    assert read.steps.microbatches == 6 and read.paired == (schedule == "1F1B")
    expanded = expand_microbatches(captured, read, target)
    direct = _iteration(schedule, stage, target)
    # Every unit of the target's iteration, in order, but the merge of the outputs: what the
    # iteration's own units allocate and free stays as captured.
    assert _shape(expanded) == _shape(direct)
    assert (expanded[ot.NAME].to_numpy() == captured[ot.NAME].to_numpy()[expanded[ORIGIN].to_numpy()]).all()


def test_steps_are_a_pass_and_the_units_to_the_next() -> None:
    steps = microbatch_steps(_iteration("1F1B", 1, 3))
    assert steps.phases == ("fwd", "bwd") * 3
    # The batch drawn before the first pass is the iteration's; a forward step holds its loss,
    # the next microbatch's receive belongs to the backward step before it.
    assert steps.bounds[:3] == ((3, 5), (5, 8), (8, 10))


def test_passes_that_are_not_a_forward_and_a_backward_per_microbatch_are_refused() -> None:
    units = pd.DataFrame(
        [_unit("a", "fwd"), _unit("send", "iter", comm="send"), _unit("b", "fwd"), _unit("c", "bwd")]
    )
    with pytest.raises(TemplateError, match="2 forward and 1 backward passes"):
        microbatch_steps(units)
    with pytest.raises(TemplateError, match="no forward or backward pass"):
        microbatch_steps(pd.DataFrame([_unit("aten::add_", "optim")]))


def test_too_few_alike_microbatches_are_refused_with_what_to_capture() -> None:
    with pytest.raises(TemplateError, match="capture with more microbatches"):
        schedule_of(_iteration("1F1B", 1, 2))
    read = schedule_of(_iteration("1F1B", 0, 6))
    with pytest.raises(TemplateError, match="5 alike periods and at least one stays, so at least 2"):
        expand_microbatches(_iteration("1F1B", 0, 6), read, 1)


def _ops(iterations: list[pd.DataFrame]) -> tuple[pd.DataFrame, list[pd.DataFrame]]:
    """The op table of several iterations (``SEQ`` its row) and each iteration's rows."""
    out, at = [], 0
    for i, units in enumerate(iterations):
        units = units.copy()
        units[ot.ITERATION], units[ot.SEQ] = i, np.arange(at, at + len(units))
        at += len(units)
        out.append(units)
    return pd.concat(out, ignore_index=True), out


def _target(ops: pd.DataFrame, microbatches: int, held: tuple[int, ...] = ()) -> MicrobatchTarget:
    """Frees traced as the iterations were built: the merge frees each loss of the iteration
    (or, merged at the start, of the iteration before)."""

    def freed_of_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inside = np.zeros(len(ops), np.int64)
        merges = ops.index[ops[ot.NAME] == "aten::merge"]
        for _, part in ops.groupby(ot.ITERATION):
            is_loss = (part[ot.NAME] == "loss").to_numpy()
            losses = int((rows[part[ot.SEQ].to_numpy()] & is_loss).sum())
            after = merges[merges > part.index[is_loss].min()]
            if losses and len(after):  # the first merge after them frees them
                inside[after[0]] += KEPT * losses
        return inside, np.zeros(len(ops), np.int64)

    return MicrobatchTarget(
        microbatches=microbatches, freed_of_rows=freed_of_rows, memory_addresses=lambda: np.array(held)
    )


def test_what_a_microbatch_keeps_is_freed_for_every_microbatch() -> None:
    ops, iterations = _ops([_iteration("1F1B", 1, 6), _iteration("1F1B", 1, 6)])
    units = iterations[0].drop(columns=[ot.ITERATION, ot.SEQ])
    expanded, waits, change = retarget_microbatches(units, iterations, {}, _target(ops, 8), len(ops))
    merge = expanded[expanded[ot.NAME] == "aten::merge"]
    assert merge[ot.FREE_BYTES].tolist() == [KEPT * 8]
    assert waits == {} and change.static_bytes == 0  # freed within the iteration: nothing held
    running = np.cumsum(expanded[ot.ALLOC_BYTES] - expanded[ot.FREE_BYTES])
    assert running.iloc[-1] == 0  # what the iteration allocates it frees, at 8 as at 6


def test_at_another_layer_count_a_free_whose_unit_has_no_copy_is_freed_where_the_loop_keeps_it() -> None:
    """Units at another layer count name the captured unit each copies (``ORIGIN``). Where the
    unit that freed what the microbatches keep has no copy (one of a loop over parameters, fewer
    at that count), the loop's unit before the next copied one frees it, once a microbatch."""
    ops, iterations = _ops([_iteration("1F1B", 1, 6), _iteration("1F1B", 1, 6)])
    units = iterations[0].drop(columns=[ot.ITERATION, ot.SEQ])
    merge = int(np.flatnonzero(units[ot.NAME] == "aten::merge")[0])
    units[ORIGIN] = np.arange(len(units))
    units.loc[merge, ORIGIN] = merge - 1  # a copy of another unit, still freeing the loop's bytes
    expanded, _, _ = retarget_microbatches(units, iterations, {}, _target(ops, 8), len(ops))
    assert expanded[ot.FREE_BYTES].iloc[-2] == KEPT * 8  # the unit before the optimizer's
    assert (expanded[ot.ALLOC_BYTES] - expanded[ot.FREE_BYTES]).sum() == 0
    fewer, _, _ = retarget_microbatches(units, iterations, {}, _target(ops, 4), len(ops))
    assert fewer[ot.FREE_BYTES].iloc[-2] == KEPT * 4


def test_at_another_layer_count_a_kept_block_copied_for_each_layer_is_freed_for_each_copy() -> None:
    """A last stage whose every layer keeps its activations for the loss, built at twice its
    layers: each microbatch's kept unit is copied (``ORIGIN``: the captured one), the merge frees
    both copies' bytes (as the layer step leaves it), and the microbatch step counts the block
    once for each copy, at 8 microbatches as at 6."""
    ops, iterations = _ops([_iteration("1F1B", 1, 6), _iteration("1F1B", 1, 6)])
    units = iterations[0].drop(columns=[ot.ITERATION, ot.SEQ])
    units[ORIGIN] = np.arange(len(units))
    losses = units[units[ot.NAME] == "loss"]
    units = pd.concat([units, losses]).sort_index(kind="stable").reset_index(drop=True)
    merge = units[ot.NAME] == "aten::merge"
    units.loc[merge, ot.FREE_BYTES] = 2 * KEPT * 6
    expanded, _, _ = retarget_microbatches(units, iterations, {}, _target(ops, 8), len(ops))
    assert expanded.loc[expanded[ot.NAME] == "aten::merge", ot.FREE_BYTES].tolist() == [2 * KEPT * 8]
    assert (expanded[ot.ALLOC_BYTES] - expanded[ot.FREE_BYTES]).sum() == 0


def test_what_a_microbatch_keeps_into_the_next_iteration_is_held_as_it_begins() -> None:
    captured = [_iteration("1F1B", 1, 6, merge_at_start=True) for _ in range(3)]
    ops, iterations = _ops(captured)
    units = iterations[1].drop(columns=[ot.ITERATION, ot.SEQ])
    _, _, change = retarget_microbatches(units, iterations[1:], {}, _target(ops, 9), len(ops))
    assert change.static_bytes == 3 * KEPT


def test_a_frees_the_iterations_units_do_not_account_for_is_refused() -> None:
    ops, iterations = _ops([_iteration("1F1B", 1, 6)])
    units = iterations[0].drop(columns=[ot.ITERATION, ot.SEQ])
    nothing = MicrobatchTarget(
        microbatches=8,
        freed_of_rows=lambda rows: (np.zeros(len(ops), np.int64),) * 2,
        memory_addresses=lambda: np.zeros(0),
    )
    with pytest.raises(TemplateError, match=f"keeps {KEPT} bytes past its steps"):
        retarget_microbatches(units, iterations, {}, nothing, len(ops))


def test_receive_buffers_held_one_a_microbatch_grow_with_the_microbatches() -> None:
    units = _iteration("1F1B", 0, 6)
    read = schedule_of(units)
    assert persistent_receive_bytes(units, read, np.zeros(0, np.int64)) == 1024
    # Allocated while the profiler recorded: the step's own memory, already repeated with it.
    assert persistent_receive_bytes(units, read, np.arange(7000, 7006)) == 0
    shared = units.assign(**{ot.BUFFER: np.where(units[ot.BUFFER] > 0, 7000, 0)})
    assert persistent_receive_bytes(shared, read, np.zeros(0, np.int64)) == 0  # one for all: held once
    mixed = units.copy()
    mixed.loc[mixed[ot.BUFFER] == 7004, ot.BUFFER] = 7003
    with pytest.raises(TemplateError, match="some shared and some not"):
        persistent_receive_bytes(mixed, read, np.zeros(0, np.int64))


def test_stages_whose_schedules_read_differently_are_refused_and_the_batch_noted() -> None:
    pipelined = {"0": schedule_of(_iteration("1F1B", 0, 6)), "1": schedule_of(_iteration("1F1B", 1, 6))}
    (first, second) = microbatch_notes(pipelined, 9)
    assert first.startswith("stage 0:") and "432 bytes" in first and "aten::randint" in first
    assert "up to 216 bytes" in first  # 432 x (9 - 6) / 6
    assert microbatch_notes(pipelined, 6) == ()
    mixed = {"0": schedule_of(_iteration("GPipe", 0, 6)), "1": pipelined["1"]}
    with pytest.raises(TemplateError, match="repeat differently"):
        microbatch_notes(mixed, 8)


def _interleaved(rank: int, microbatches: int, stages: int = 2, local: int = 2) -> pd.DataFrame:
    """One iteration of a rank holding ``local`` stages of an interleaved 1F1B schedule, in the
    order torch's runs them: rounds of ``stages`` microbatches, warm-up forwards, forward-backward
    pairs, cool-down backwards; each forward names its stage (``STAGE``)."""
    per_round = microbatches // max(1, microbatches // stages)
    warmup = min((local - 1) * per_round + 2 * (stages - 1 - rank), microbatches * local)
    total = microbatches * local
    order = [("F", f) for f in range(warmup)]
    for i in range(total - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", b) for b in range(total - warmup, total)]
    units = [_unit("aten::randint", "iter", alloc=432), _unit("aten::slice", "iter", free=432)]
    for kind, step in order:
        if kind == "F":
            stage = (step // per_round) % local
            units += [
                _unit("recv", "iter", comm="recv"),
                _unit("aten::linear", "fwd", alloc=100) | {ot.STAGE: stage},
            ]
            units.append(_unit("send", "iter", comm="send"))
        else:
            units += [_unit("recv", "iter", comm="recv"), _unit("AddmmBackward0", "bwd", free=100)]
            units.append(_unit("send", "iter", comm="send"))
    units.append(_unit("aten::add_", "optim"))
    frame = pd.DataFrame(units)
    frame[ot.STAGE] = frame[ot.STAGE].fillna(-1).astype(np.int64)
    return frame


@pytest.mark.parametrize("rank", [0, 1])
def test_an_interleaved_schedule_grows_by_rounds_as_if_captured_there(rank: int) -> None:
    captured = _interleaved(rank, 6)
    read = schedule_of(captured)
    # A microbatch runs a forward through each of the rank's two stages; single pairs repeat
    # only within a round, so a period is a round: two microbatches, four pairs.
    assert read.steps.microbatches == 6 and read.steps.roots == 2
    assert read.microbatches_a_period == 2 and "rounds of 2" in read.repeats
    for target in (8, 12, 4):
        expanded = expand_microbatches(captured, read, target)
        assert _shape(expanded) == _shape(_interleaved(rank, target))
        assert expanded[ot.STAGE].tolist() == _interleaved(rank, target)[ot.STAGE].tolist()
    with pytest.raises(TemplateError, match="rounds of 2 microbatches"):
        expand_microbatches(captured, read, 7)


def test_a_period_that_is_no_whole_round_of_the_stages_is_refused() -> None:
    """Two stages a rank whose repeating pairs all run one of them: a period of them holds no
    whole microbatch, so no count can grow by it."""
    units = _iteration("1F1B", 0, 6)
    forward = (units[ot.PHASE] == "fwd").to_numpy()
    units[ot.STAGE] = np.where(forward, 0, -1)
    units.loc[np.flatnonzero(forward)[:2], ot.STAGE] = 1  # the warm-up's forwards run the other stage
    with pytest.raises(TemplateError, match=r"runs them \{0: 1\} times: no whole round"):
        schedule_of(units)


def test_several_modules_whose_passes_repeat_no_round_are_refused() -> None:
    units = _iteration("GPipe", 0, 6)
    forward = (units[ot.PHASE] == "fwd").to_numpy()
    units[ot.STAGE] = np.where(forward, np.cumsum(forward) % 2, -1)  # two models, each forward in turn
    assert microbatch_steps(units).microbatches == 3
    with pytest.raises(TemplateError, match="run 2 modules"):
        schedule_of(units)


def test_a_backward_of_several_runs_a_microbatch_is_one_step() -> None:
    # A loss computed and backpropagated in chunks before the stage's own backward (torchtitan's
    # last stage): two runs of the engine a microbatch here (the last chunk's runs on into the
    # stage's), one step.
    def chunked(units: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for row in units.to_dict("records"):
            if row[ot.NAME] == "AddmmBackward0":
                for _ in range(2):
                    rows += [_unit("aten::linear", "iter"), _unit("CrossEntropyBackward", "bwd")]
            rows.append(row)
        return pd.DataFrame(rows)

    captured = chunked(_iteration("1F1B", 1, 6))
    steps = microbatch_steps(captured)
    assert steps.phases == ("fwd", "bwd") * 6 and steps.microbatches == 6
    read = schedule_of(captured)
    assert _shape(expand_microbatches(captured, read, 8)) == _shape(chunked(_iteration("1F1B", 1, 8)))
    # Where no run names a layer block, runs that do not come as many a microbatch are refused.
    uneven = captured.drop(index=captured.index[captured[ot.NAME] == "CrossEntropyBackward"][:1])
    uneven = uneven.reset_index(drop=True)
    with pytest.raises(TemplateError, match="6 forward and 11 backward passes"):
        microbatch_steps(uneven)
    # Where the stage's own runs go through its layers, the runs through none before each are its
    # microbatch's, as many or not (an interleaved rank: one of its stages computes the loss) and
    # whatever calls come between (a receive posted for the next step).
    layered = uneven.assign(**{ot.LAYER: np.where(uneven[ot.NAME] == "AddmmBackward0", 0, -1)})
    chunks = layered.index[layered[ot.NAME] == "CrossEntropyBackward"][1::2]
    recvs = pd.DataFrame(
        [_unit("recv", "iter", comm="recv") | {ot.LAYER: -1}] * len(chunks), index=chunks + 0.5
    )
    layered = pd.concat([layered, recvs]).sort_index().reset_index(drop=True)
    assert microbatch_steps(layered).phases == ("fwd", "bwd") * 6


def _zero_bubble(stage: int, microbatches: int, stages: int = 2) -> pd.DataFrame:
    """A stage of a zero-bubble schedule: each backward computes the input gradients through the
    layers, then the weight gradients in an engine run of their own that names no layer, deferred
    to the end for the last microbatches (the cool-down)."""

    def unit(name: str, phase: str, layer: int = -1, **kw) -> dict:
        return {**_unit(name, phase, **kw), ot.LAYER: layer}

    warmup = min(stages - stage - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        order += [("F", warmup + m), ("I", m), ("W", m)]
    order += [("I", m) for m in range(microbatches - warmup, microbatches)]
    order += [("W", m) for m in range(microbatches - warmup, microbatches)]
    units = [unit("aten::randint", "iter", alloc=432)]
    for kind, _ in order:
        if kind == "F":
            units += [unit("aten::linear", "fwd", 0, alloc=100), unit("send", "iter", comm="send")]
        elif kind == "I":
            units += [unit("MmBackward0", "bwd", 0, free=60), unit("send", "iter", comm="send")]
        else:
            units += [unit("weight_grad", "bwd", alloc=8), unit("aten::add_", "bwd", free=48)]
    return pd.DataFrame([*units, unit("aten::add_", "optim")])


@pytest.mark.parametrize("stage", [0, 1])
@pytest.mark.parametrize("target", [8, 4])
def test_a_zero_bubble_schedules_weight_gradients_go_with_their_microbatchs_backward(
    stage: int, target: int
) -> None:
    captured = _zero_bubble(stage, 6)
    read = schedule_of(captured)
    assert read.steps.microbatches == 6 and read.paired
    # Each microbatch's weight-gradient run is part of the step of its inputs' backward.
    assert read.steps.phases.count("bwd") == 6
    assert _shape(expand_microbatches(captured, read, target)) == _shape(_zero_bubble(stage, target))


def test_backward_runs_in_a_row_are_steps_of_their_own_where_their_marks_say_so() -> None:
    # A V-shaped schedule's last stage ends on its microbatches' backward runs one after the other,
    # nothing between: each run its own mark (the outermost holding its units), each a step.
    captured = _iteration("GPipe", 1, 6)
    captured = captured[captured[ot.NAME] != "send"].reset_index(drop=True)
    marked = captured.assign(**{ot.OUTER_MARK: np.arange(len(captured))})
    assert microbatch_steps(marked).phases == ("fwd",) * 6 + ("bwd",) * 6
    with pytest.raises(TemplateError, match="6 forward and 1 backward passes"):
        microbatch_steps(captured)  # one mark for all: one pass


HANDED = 2048


def test_what_a_microbatch_hands_into_the_next_iteration_is_held_one_each_microbatch() -> None:
    """A buffer each microbatch's forward makes and the next iteration's same forward replaces
    (an input handed between a rank's own stages): each step allocates and frees as much, and
    the iteration holds one a microbatch from the one before."""

    def handed(units: pd.DataFrame) -> pd.DataFrame:
        rows = []
        for row in units.to_dict("records"):
            rows.append(row)
            if row[ot.NAME] == "aten::linear":
                rows.append(_unit("handoff", "iter", alloc=HANDED, free=HANDED))
        return pd.DataFrame(rows)

    ops, iterations = _ops([handed(_iteration("1F1B", 0, 6)) for _ in range(2)])

    def freed_of_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inside = np.zeros(len(ops), np.int64)
        handoffs = [part.index[part[ot.NAME] == "handoff"] for _, part in ops.groupby(ot.ITERATION)]
        for now, after in zip(handoffs[:-1], handoffs[1:], strict=True):
            inside[after[rows[now]]] += HANDED  # each replaced by its own microbatch's, one iteration on
        return inside, np.zeros(len(ops), np.int64)

    seen = np.arange(7000, 7006)  # the receive buffers: allocated while traced, nothing held of them
    target = MicrobatchTarget(microbatches=9, freed_of_rows=freed_of_rows, memory_addresses=lambda: seen)
    units = iterations[0].drop(columns=[ot.ITERATION, ot.SEQ])
    _, _, change = retarget_microbatches(units, iterations, {}, target, len(ops))
    assert change.static_bytes == 3 * HANDED
    _, _, alone = retarget_microbatches(units, iterations[:1], {}, target, len(ops))
    assert alone.static_bytes == 0  # one iteration traced: nothing to see handed on


def test_what_the_iteration_allocates_after_its_last_microbatch_bounds_the_peak_too() -> None:
    captured = _iteration("1F1B", 1, 6)
    optimizer = len(captured) - 1
    captured.loc[optimizer, ot.ALLOC_BYTES] = 999  # the optimizer's step: not the batch's
    merged = pd.DataFrame([_unit("aten::cat", "iter", alloc=4096)], index=[optimizer - 0.5])
    captured = pd.concat([captured, merged]).sort_index().reset_index(drop=True)
    (note,) = microbatch_notes({"1": schedule_of(captured)}, 9)
    assert "4,096 bytes after its last, most in aten::cat" in note
    assert "up to 2,264 bytes" in note  # (432 + 4,096) x (9 - 6) / 6
