"""A program's iteration walked at another layer count: passes, steady runs, their repetition."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from prism.graph.build import op_table as ot
from prism.graph.build.bucket_calls import READY, WHOLE, BucketCaps
from prism.graph.build.layer_passes import (
    ORIGIN,
    LayerTarget,
    expand_layers,
    kept_per_layer,
    layer_passes,
    retarget_units,
)
from prism.graph.build.templates import TemplateError


def _unit(name: str, layer: int, phase: str, *, alloc: int = 0, free: int = 0, comm: str = "") -> dict:
    return {
        ot.NAME: name, ot.LAYER: layer, ot.PHASE: phase, ot.IS_COMM: bool(comm), ot.COMM_OP: comm,
        ot.GROUP_LABEL: "dp.0" if comm else "", ot.BYTES: 64 if comm else -1, ot.ALLOC_BYTES: alloc,
        ot.FREE_BYTES: free,
    }  # fmt: skip


def _forward(layers: int) -> list[dict]:
    """Each block gathers its parameters; the first finds nothing prefetched (a longer gather),
    the last frees what the pass allocated before it."""
    units = []
    for i in range(layers):
        gathered = 512 if i == 0 else 256
        units.append(_unit("all_gather", i, "fwd", comm="all_gather", alloc=gathered, free=gathered))
        units.append(_unit("aten::linear", i, "fwd", alloc=100, free=300 if i == layers - 1 else 0))
        units.append(_unit("between", -1, "fwd"))  # unmarked, between two blocks: the block before's
    return units


def _backward(layers: int) -> list[dict]:
    """Each block frees its forward's 100 bytes and keeps 8 bytes of gradient past the iteration
    (freed by the program's zero_grad); the first two blocks of the pass free more (the second: a
    buffer the first prefetched)."""
    units = []
    for i in reversed(range(layers)):
        free = {layers - 1: 250, layers - 2: 170}.get(i, 150)
        units.append(_unit("AddmmBackward0", i, "bwd", alloc=58, free=free))
        units.append(_unit("reduce_scatter", i, "bwd", comm="reduce_scatter"))
    return units


def _iteration(layers: int, microbatches: int = 1) -> pd.DataFrame:
    units = [_unit("aten::embedding", -1, "fwd")]
    for _ in range(microbatches):
        units += _forward(layers) + [_unit("loss", -1, "iter")] + _backward(layers)
    units += [_unit("zero_grad", -1, "iter", free=8 * layers), _unit("aten::add_", -1, "optim")]
    return pd.DataFrame(units)


def _key(frame: pd.DataFrame) -> list[tuple]:
    return [tuple(row) for row in frame[[ot.NAME, ot.LAYER, ot.PHASE, ot.ALLOC_BYTES]].to_numpy()]


def test_an_expanded_iteration_is_the_one_captured_with_more_layers():
    # What a capture at 8 layers would have recorded, from one at 5 (the zero_grad's free aside).
    expanded, direct = expand_layers(_iteration(5), 8), _iteration(8)
    assert _key(expanded) == _key(direct)
    assert expanded[ot.FREE_BYTES].tolist()[:-2] == direct[ot.FREE_BYTES].tolist()[:-2]


def test_each_microbatch_walks_its_own_passes():
    assert _key(expand_layers(_iteration(5, microbatches=2), 7)) == _key(_iteration(7, microbatches=2))
    assert len(layer_passes(_iteration(5, microbatches=2))) == 4


def _interleaved(layers: int) -> pd.DataFrame:
    """A rank holding two stages (an interleaved schedule's), their layers numbered from 0 in each
    (stage 1's blocks allocate more), two microbatches: each stage's forward, then backward in
    reverse stage order, as its units' marks name them."""
    units = []
    for _ in range(2):
        for stage in (0, 1):
            units += [
                u
                | {
                    ot.STAGE: stage,
                    ot.ALLOC_BYTES: u[ot.ALLOC_BYTES] + stage * (u[ot.NAME] == "aten::linear"),
                }
                for u in _forward(layers)
            ]
        for stage in (1, 0):
            units += [u | {ot.STAGE: stage} for u in _backward(layers)]
    units += [_unit("zero_grad", -1, "iter", free=16 * layers) | {ot.STAGE: -1}]
    return pd.DataFrame(units)


def test_each_stage_of_a_rank_that_holds_several_walks_its_own_stack():
    units = _interleaved(5)
    passes = layer_passes(units)
    assert [p.stage for p in passes] == [0, 1, 1, 0] * 2
    expanded = expand_layers(units, 7, first={0: 0, 1: 7})
    direct = _interleaved(7)
    direct[ot.LAYER] = np.where(
        (direct[ot.STAGE] == 1) & (direct[ot.LAYER] >= 0), direct[ot.LAYER] + 7, direct[ot.LAYER]
    )
    assert _key(expanded) == _key(direct)
    assert expanded[ot.STAGE].tolist() == direct[ot.STAGE].tolist()
    with pytest.raises(TemplateError, match="stages the units run"):
        expand_layers(units, 7, first={-1: 0})


def test_fewer_layers_keep_the_edge_runs():
    assert _key(expand_layers(_iteration(6), 5)) == _key(_iteration(5))


def test_the_edges_and_the_steady_runs_are_found():
    forward, backward = layer_passes(_iteration(5))
    assert (forward.descending, backward.descending) == (False, True)
    # The forward's first run gathers more, its last frees the pass: runs 1-3 are alike; the
    # backward's first two differ.
    assert forward.steady == (1, 4)
    assert backward.steady == (2, 4)
    # The unmarked unit after a block is its run's; the one after a pass's last block is not.
    assert forward.runs[0] == (1, 4) and forward.runs[-1] == (13, 15)


def test_origin_names_the_captured_unit_each_copies():
    captured, expanded = _iteration(5), expand_layers(_iteration(5), 9)
    assert (captured.iloc[expanded[ORIGIN]][ot.NAME].to_numpy() == expanded[ot.NAME].to_numpy()).all()


def test_a_layer_keeps_what_its_steady_runs_do_not_free():
    units = _iteration(5)
    assert kept_per_layer(units, layer_passes(units)) == 8


def test_too_few_alike_inner_layers_are_refused():
    with pytest.raises(TemplateError, match="capture with more layers"):
        expand_layers(_iteration(3), 8)


def test_inner_layers_that_allocate_each_by_its_own_data_are_refused_saying_so():
    # A mixture of experts: every layer runs the same units, but what each allocates follows the
    # tokens routed through it, so no layer stands for another, however many are captured.
    units = _iteration(7)
    forward = (units[ot.PHASE] == "fwd") & (units[ot.NAME] == "aten::linear")
    routed = units[ot.ALLOC_BYTES].where(~forward, 100 + 4 * units[ot.LAYER])
    with pytest.raises(TemplateError, match="differ in alloc_bytes.*capture at the target layer count"):
        expand_layers(units.assign(**{ot.ALLOC_BYTES: routed}), 8)


def test_fewer_layers_than_the_edges_are_refused():
    with pytest.raises(TemplateError, match="at least 4"):
        expand_layers(_iteration(5), 2)


def test_layers_out_of_order_are_refused():
    units = _iteration(5)
    swapped = units[ot.LAYER].replace({1: 2, 2: 1})
    with pytest.raises(TemplateError, match="in order"):
        expand_layers(units.assign(**{ot.LAYER: swapped}), 8)


def test_an_iteration_without_layer_marks_is_refused():
    units = _iteration(5).assign(**{ot.LAYER: -1})
    assert layer_passes(units) == []
    with pytest.raises(TemplateError, match="marks no layer"):
        expand_layers(units, 8)


def _timed(units: pd.DataFrame) -> pd.DataFrame:
    return units.assign(**{ot.DUR_NS: 1000, ot.GAP_NS: 100, ot.SEQ: range(len(units))})


def _target(
    units: pd.DataFrame,
    layers: int,
    *,
    freed_at: str = "zero_grad",
    elements: tuple[int, ...] = (4,),
    sources: tuple[int, ...] = (0,),
) -> LayerTarget:
    """Two profiled iterations of ``units``; the program frees each layer's kept 8 bytes at ``freed_at``."""
    n = len(units)
    inside = np.zeros(2 * n, np.int64)
    inside[n + int(np.flatnonzero(units[ot.NAME] == freed_at)[0])] = 8
    return LayerTarget(
        layers=layers, first_layers={-1: 0}, parameter_sources=sources, parameter_elements=elements,
        freed_of_layer=lambda stage, layer: (inside, np.zeros_like(inside)), layer_bytes=64,
    )  # fmt: skip


def _two_iterations(units: pd.DataFrame) -> list[pd.DataFrame]:
    return [units, units.assign(**{ot.SEQ: units[ot.SEQ] + len(units)})]


def test_what_a_layer_keeps_is_freed_for_every_layer_where_the_capture_freed_it() -> None:
    units = _timed(_iteration(5))
    out, _, _ = retarget_units(units, _two_iterations(units), {}, _target(units, 9))
    zero_grad = out[out[ot.NAME] == "zero_grad"]
    assert zero_grad[ot.FREE_BYTES].tolist() == [8 * 9]
    # The iteration is balanced again: what it allocates it frees.
    assert (
        out[ot.ALLOC_BYTES].sum() - out[ot.FREE_BYTES].sum()
        == units[ot.ALLOC_BYTES].sum() - units[ot.FREE_BYTES].sum()
    )


def test_kept_memory_freed_inside_the_layers_is_refused() -> None:
    units = _timed(_iteration(5))
    # Freed inside a layer's run: which layer's copies would free it is not known.
    target = _target(units, 9, freed_at="AddmmBackward0")
    with pytest.raises(TemplateError, match="keeps 8 bytes"):
        retarget_units(units, _two_iterations(units), {}, target)


def test_weight_gradients_run_apart_from_the_layers_unmarked_are_refused() -> None:
    # A zero-bubble schedule captured without weight marks: each microbatch's weight gradients in
    # runs of the engine after the input gradients' run through the layers, naming none; a loss
    # backpropagated in chunks before the stage's own backward is not.
    def iteration(weights_after: bool) -> pd.DataFrame:
        units = [_unit("aten::embedding", -1, "fwd"), *_forward(5), _unit("loss", -1, "iter")]
        run = [_unit("NllLossBackward0", -1, "bwd"), _unit("between", -1, "iter")]
        units += (
            (_backward(5) + [_unit("between", -1, "iter")] + run) if weights_after else (run + _backward(5))
        )
        units += [_unit("zero_grad", -1, "iter", free=8 * 5), _unit("aten::add_", -1, "optim")]
        return _timed(pd.DataFrame(units))

    zero_bubble, chunked = iteration(True), iteration(False)
    with pytest.raises(TemplateError, match="split backward's weight gradients"):
        retarget_units(zero_bubble, _two_iterations(zero_bubble), {}, _target(zero_bubble, 9))
    out, _, _ = retarget_units(chunked, _two_iterations(chunked), {}, _target(chunked, 9))
    assert (out[ot.NAME] == "NllLossBackward0").sum() == 1 and (out[ot.LAYER] == 8).any()


def _split_backward(layers: int) -> list[dict]:
    """A split backward: the input gradients' run through the layers (descending), then a weight
    run per linear of each layer, as the stage holds them (ascending), and the head's in none."""
    weights = [
        {**_unit("MmBackward0", i, "bwd", alloc=8, free=100 if i else 150), ot.PART: "weights"}
        for i in range(layers)
        for _ in range(2)
    ]
    return _backward(layers) + weights + [{**_unit("MmBackward0", -1, "bwd"), ot.PART: "weights"}]


def test_marked_weight_runs_walk_the_layers_again_and_are_repeated_with_them() -> None:
    def iteration(layers: int) -> pd.DataFrame:
        units = [_unit("aten::embedding", -1, "fwd"), *_forward(layers), _unit("loss", -1, "iter")]
        units += _split_backward(layers) + [_unit("zero_grad", -1, "iter", free=8 * layers)]
        return pd.DataFrame(units).fillna({ot.PART: ""})

    passes = layer_passes(iteration(5))
    # Forward, the input gradients' pass and the weights' pass: the last begins on the layer the one
    # before ends on, and walks up.
    assert [p.descending for p in passes] == [False, True, False]
    expanded, direct = expand_layers(iteration(5), 8), iteration(8)
    assert _key(expanded) == _key(direct)
    assert expanded[ot.PART].tolist() == direct[ot.PART].tolist()


def test_a_step_of_a_few_kernels_scales_with_the_parameter_elements() -> None:
    units = _timed(_iteration(5))  # one kernel over three parameters of 10, 20 and 30 elements
    target = _target(units, 9, elements=(10, 20, 30), sources=(0, 1, 1, 1, 2))
    out, _, _ = retarget_units(units, _two_iterations(units), {}, target)
    step = out[out[ot.PHASE] == "optim"]
    assert step[[ot.DUR_NS, ot.GAP_NS]].values.tolist() == [[1667, 167]]  # 100 elements over 60


def test_a_step_that_runs_each_parameter_in_turn_runs_each_target_parameters_group() -> None:
    units = _timed(_iteration(5))
    step = pd.DataFrame(
        [
            _unit(name, -1, "optim", alloc=size)
            for size in (1, 2, 3)
            for name in ("aten::mul_", "aten::addcdiv_")
        ]
    ).assign(**{ot.DUR_NS: 1000, ot.GAP_NS: 100})
    units = _timed(pd.concat([units.iloc[:-1], step], ignore_index=True))
    target = _target(units, 9, elements=(10, 20, 30), sources=(0, 1, 1, 1, 2))
    out, _, _ = retarget_units(units, _two_iterations(units), {}, target)
    groups = out[out[ot.PHASE] == "optim"]
    assert groups[ot.ALLOC_BYTES].tolist() == [1, 1, 2, 2, 2, 2, 2, 2, 3, 3]
    assert (groups[ot.DUR_NS] == 1000).all()  # each group as captured: no temporaries grown


def test_glue_run_once_a_parameter_runs_once_a_target_parameter() -> None:
    # After the passes, one div_ a parameter (a pipeline schedule scaling each gradient by its
    # microbatches): the embedding's, then one a block's; at 8 layers the block's is copied for
    # every block. A stretch of another length is not a loop over parameters and stays.
    units = _iteration(5)
    scale = pd.DataFrame([_unit("aten::div_", -1, "iter", alloc=a) for a in (10, 1, 2, 3, 4, 5)])
    other = pd.DataFrame([_unit("aten::mul_", -1, "iter")] * 3)
    units = _timed(pd.concat([units.iloc[:-2], scale, other, units.iloc[-2:]], ignore_index=True))
    target = replace(
        _target(units, 8), parameter_elements=(10, 4, 4, 4, 4, 4), parameter_sources=(0, *[1] * 8)
    )
    out, _, _ = retarget_units(units, _two_iterations(units), {}, target)
    assert out[out[ot.NAME] == "aten::div_"][ot.ALLOC_BYTES].tolist() == [10, *[1] * 8]
    assert (out[ot.NAME] == "aten::mul_").sum() == 3


def test_a_loop_over_parameters_after_one_unit_for_the_stage_input_keeps_that_unit() -> None:
    # A split backward takes its stage input's gradient node, then each parameter's: one view_as
    # for the input, one a parameter, in a row. At 8 layers: the input's, then nine.
    units = _iteration(5)
    nodes = pd.DataFrame([_unit("aten::view_as", -1, "iter", alloc=a) for a in (7, 10, 1, 2, 3, 4, 5)])
    units = _timed(pd.concat([units.iloc[:-2], nodes, units.iloc[-2:]], ignore_index=True))
    target = replace(
        _target(units, 8), parameter_elements=(10, 4, 4, 4, 4, 4), parameter_sources=(0, *[1] * 8)
    )
    out, _, _ = retarget_units(units, _two_iterations(units), {}, target)
    assert out[out[ot.NAME] == "aten::view_as"][ot.ALLOC_BYTES].tolist() == [7, 10, *[1] * 8]


def test_glue_run_once_a_parameter_bucket_by_bucket_runs_once_a_target_parameter() -> None:
    # DDP's copies out of its buckets after the backward: two ops a parameter, bucket by bucket
    # (two parameters, then four); at 8 layers one stretch of each, nine parameters long.
    units = _iteration(5)
    names = (
        ["aten::as_strided"] * 2
        + ["copy_bucket_to_grad"] * 2
        + ["aten::as_strided"] * 4
        + ["copy_bucket_to_grad"] * 4
    )
    copies = pd.DataFrame([_unit(name, -1, "bwd") for name in names])
    units = _timed(pd.concat([units.iloc[:-2], copies, units.iloc[-2:]], ignore_index=True))
    target = replace(
        _target(units, 8), parameter_elements=(10, 4, 4, 4, 4, 4), parameter_sources=(0, *[1] * 8)
    )
    out, _, _ = retarget_units(units, _two_iterations(units), {}, target)
    glue = out[out[ot.NAME].isin(["aten::as_strided", "copy_bucket_to_grad"])][ot.NAME].tolist()
    assert glue == ["aten::as_strided"] * 9 + ["copy_bucket_to_grad"] * 9


def test_a_copied_call_is_waited_for_at_its_waits_copy() -> None:
    units = _timed(_iteration(5))
    gathers = np.flatnonzero(units[ot.NAME] == "all_gather")
    # Each block's gather is waited for at the next block's linear (the last one's at the loss).
    linear = np.flatnonzero(units[ot.NAME] == "aten::linear")
    loss = int(np.flatnonzero(units[ot.NAME] == "loss")[0])
    waits = {int(w): [int(g)] for g, w in zip(gathers, [*linear[1:], loss], strict=True)}
    out, mapped, _ = retarget_units(units, _two_iterations(units), waits, _target(units, 8))
    new_gathers = np.flatnonzero(out[ot.NAME] == "all_gather")
    new_linear = np.flatnonzero(out[ot.NAME] == "aten::linear")
    new_loss = int(np.flatnonzero(out[ot.NAME] == "loss")[0])
    assert {c for calls in mapped.values() for c in calls} == set(new_gathers.tolist())
    assert mapped == {int(w): [int(g)] for g, w in zip(new_gathers, [*new_linear[1:], new_loss], strict=True)}


def test_a_call_posted_before_a_pass_is_waited_for_where_the_pass_ends() -> None:
    # A pipeline stage posts its next receive before a forward pass and waits for it after the
    # pass's last block: with more layers, still after the last block, not a layer earlier
    # (whose units look alike).
    units = _iteration(5)
    recv = _unit("recv", -1, "fwd", comm="recv")
    units = _timed(pd.concat([units.iloc[:1], pd.DataFrame([recv]), units.iloc[1:]], ignore_index=True))
    last_forward = int(np.flatnonzero((units[ot.LAYER] == 4) & (units[ot.PHASE] == "fwd"))[-1])
    out, mapped, _ = retarget_units(units, _two_iterations(units), {last_forward: [1]}, _target(units, 8))
    (at,) = mapped
    assert mapped[at] == [1]
    assert (out[ot.LAYER].iloc[at], out[ot.NAME].iloc[at]) == (7, "aten::linear")


def test_a_call_between_the_passes_carrying_a_layers_parameters_is_refused() -> None:
    units = _timed(_iteration(5))
    loss = _unit("all_reduce", -1, "iter", comm="all_reduce")  # a loss's: 64 bytes, under a layer's 100
    with_loss = _timed(pd.concat([units.iloc[:-1], pd.DataFrame([loss]), units.iloc[-1:]], ignore_index=True))
    target = _target(with_loss, 9)
    retarget_units(with_loss, _two_iterations(with_loss), {}, replace(target, layer_bytes=100))
    # The gradients all-reduced by hand after the step: at least one layer's parameters.
    with pytest.raises(TemplateError, match="all_reduce on dp.0 in its iter phase carries 64 bytes"):
        retarget_units(with_loss, _two_iterations(with_loss), {}, replace(target, layer_bytes=64))


def test_ddp_buckets_are_planned_again_and_waited_where_the_capture_waited() -> None:
    # One parameter a layer (40 bytes) and an embedding (120): DDP's first bucket (cap 100) fills
    # at the third gradient ready, the rest at the embedding's. The calls were waited for inside the
    # copies out of the buckets, one a parameter, after the third.
    units = _iteration(5).assign(**{ot.IS_ASYNC: False})
    backward = units.index[units[ot.NAME] == "reduce_scatter"]
    units.loc[backward, ot.NAME] = WHOLE  # each layer's gradient accumulated in its backward run
    units.loc[backward, [ot.IS_COMM, ot.COMM_OP, ot.GROUP_LABEL, ot.BYTES]] = [False, "", "", -1]
    call = {ot.IS_COMM: True, ot.IS_ASYNC: True, ot.COMM_OP: "all_reduce", ot.GROUP_LABEL: "dp.0"}
    split = [_unit(READY, -1, "bwd"), _unit("torch::distributed::reducer::mul_out", -1, "bwd")]
    ready_at = int(backward[2])  # layer 2's, the third ready
    bucket0 = [
        _unit(READY, 2, "bwd"),
        split[1] | {ot.LAYER: 2},
        _unit("all_reduce", 2, "bwd") | call | {ot.BYTES: 120},
    ]
    bucket1 = [*split, _unit("all_reduce", -1, "bwd") | call | {ot.BYTES: 200}]
    finalize = [_unit("aten::as_strided", -1, "bwd") for _ in range(6)]
    end = int(np.flatnonzero(units[ot.PHASE] == "bwd")[-1])
    units = pd.concat(
        [units.iloc[:ready_at], pd.DataFrame(bucket0), units.iloc[ready_at + 1 : end + 1], pd.DataFrame(bucket1 + finalize),
         units.iloc[end + 1 :]], ignore_index=True,
    ).assign(**{ot.IS_ASYNC: lambda f: f[ot.IS_ASYNC].eq(True)})  # fmt: skip
    units = _timed(units)
    calls = np.flatnonzero(units[ot.NAME] == "all_reduce")
    waited = int(np.flatnonzero(units[ot.NAME] == "aten::as_strided")[2])
    caps = BucketCaps(bucket_bytes=400, first_bucket_bytes=100, itemsize=4)
    target = replace(
        _target(units, 8),
        parameter_elements=(30, 10, 10, 10, 10, 10),
        parameter_sources=(0, *[1] * 8),
        bucket_caps=caps,
    )
    out, waits, _ = retarget_units(units, _two_iterations(units), {waited: calls.tolist()}, target)
    new_calls = np.flatnonzero(out[ot.NAME] == "all_reduce")
    assert out[ot.BYTES].iloc[new_calls].tolist() == [120, 4 * (5 * 10 + 30)]
    assert out[ot.LAYER].iloc[new_calls].tolist() == [5, -1]  # the third gradient ready: layer 5's of 8
    (at,) = waits
    assert sorted(waits[at]) == new_calls.tolist()
    assert out[ot.NAME].iloc[at] == "aten::as_strided" and at > new_calls[-1]
