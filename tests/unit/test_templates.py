"""Template statistics: mean timings and per-position memory (synthetic op tables)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from test_compose import CAPTURED, compose, op_table

from prism.graph.build import op_table as ot
from prism.graph.build.compose import MB
from prism.graph.build.templates import build_role_template

STAGE = 0
EXTRA = 4096  # bytes the first forward of an iteration allocates and the last backward frees


def _template(table):
    return build_role_template(table, rank=0, stage=STAGE, first_layer=CAPTURED.stage_layers(STAGE).start)


def _with_warmup_buffer(table):
    table = table.copy()
    fwd = table[ot.PHASE] == "fwd"
    bwd = table[ot.PHASE] == "bwd"
    for _, it in table.groupby(ot.ITERATION):
        first_fwd = it.index[fwd[it.index] & (it[ot.MB] == 0)][0]
        last_bwd = it.index[bwd[it.index] & (it[ot.MB] == CAPTURED.microbatches - 1)][-1]
        table.loc[first_fwd, ot.ALLOC_BYTES] += EXTRA
        table.loc[last_bwd, ot.FREE_BYTES] += EXTRA
    return table


def test_unit_durations_are_means_so_skewed_ops_add_up() -> None:
    table = op_table(STAGE, iterations=2)
    linear = (table[ot.NAME] == "aten::linear") & (table[ot.PHASE] == "fwd")
    # One slow instance in eight: the median would hide it, the iteration does not.
    slow = table.index[linear & (table[ot.MB] == 3)]
    table.loc[slow, ot.DUR_NS] = 9000
    units = _template(table).segment("fwd").units
    per_iteration = table.loc[linear].groupby(ot.ITERATION)[ot.DUR_NS].sum().mean()
    assert (
        units.loc[units[ot.NAME] == "aten::linear", ot.DUR_NS].sum() * CAPTURED.microbatches == per_iteration
    )


def _net_bytes_by_mb(program, phase):
    rows = program[program[ot.PHASE] == phase]
    return (rows[ot.ALLOC_BYTES] - rows[ot.FREE_BYTES]).groupby(rows[MB]).sum()


def test_memory_follows_the_instance_position_in_the_iteration() -> None:
    template = _template(_with_warmup_buffer(op_table(STAGE, iterations=3)))
    program = compose(template, cfg=CAPTURED, captured=CAPTURED, stage=STAGE).nodes
    fwd, bwd = _net_bytes_by_mb(program, "fwd"), _net_bytes_by_mb(program, "bwd")
    assert fwd[0] - fwd[1] == EXTRA and (fwd[1:] == fwd[1]).all()
    last = CAPTURED.microbatches - 1
    assert bwd[0] - bwd[last] == EXTRA and (bwd[:last] == bwd[0]).all()
    # A stage's iteration nets to what the captured one did: nothing is left allocated.
    captured_net = {
        it: (rows[ot.ALLOC_BYTES] - rows[ot.FREE_BYTES]).sum()
        for it, rows in _with_warmup_buffer(op_table(STAGE, iterations=3)).groupby(ot.ITERATION)
    }
    assert (program[ot.ALLOC_BYTES] - program[ot.FREE_BYTES]).sum() == captured_net[0]


def test_more_microbatches_keep_warmup_and_cooldown_memory_once() -> None:
    template = _template(_with_warmup_buffer(op_table(STAGE, iterations=2)))
    target = replace(CAPTURED, microbatches=20)
    program = compose(template, cfg=target, captured=CAPTURED, stage=STAGE).nodes
    fwd, bwd = _net_bytes_by_mb(program, "fwd"), _net_bytes_by_mb(program, "bwd")
    assert len(fwd) == 20 and fwd[0] - fwd[10] == EXTRA
    assert np.count_nonzero(fwd.to_numpy() != fwd[10]) == 1
    assert bwd[0] - bwd[19] == EXTRA and np.count_nonzero(bwd.to_numpy() != bwd[0]) == 1


def test_forwards_in_flight_before_the_first_backward_keep_their_memory_at_more_microbatches() -> None:
    # Stage 0 of pp=4 runs 3 warm-up forwards and a steady one before its first backward; each of
    # these holds EXTRA more than a forward in the steady 1F1B rhythm.
    captured = replace(CAPTURED, microbatches=6)
    table = op_table(STAGE, captured, iterations=2)
    in_flight = (table[ot.PHASE] == "fwd") & (table[ot.MB] < 4) & (table[ot.NAME] == "aten::add")
    table.loc[in_flight, ot.ALLOC_BYTES] += EXTRA
    template = _template(table)
    for microbatches in (6, 12):
        target = replace(CAPTURED, microbatches=microbatches)
        program = compose(template, cfg=target, captured=captured, stage=STAGE).nodes
        fwd = _net_bytes_by_mb(program, "fwd")
        steady = fwd[microbatches - 1]
        assert (fwd[:4] - steady == EXTRA * CAPTURED.layers_per_stage).all(), microbatches
        assert (fwd[4:] == steady).all(), microbatches  # never a mean of in-flight and steady
