"""Templates and stage programs built from synthetic op tables of a GPT-like role."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.params import stage_buckets
from prism.graph.build import op_table as ot
from prism.graph.build.bind import bind_ranks, encode_program
from prism.graph.build.compose import (
    DEPS,
    GSEQ,
    LAYER,
    MB,
    P2P_DIR,
    P2P_SEQ,
    GradBuckets,
    StageProgram,
    compose_stage,
    finish_nodes,
    wait_node,
    waiting_columns,
)
from prism.graph.build.templates import TemplateError, build_role_template, split_segments
from prism.graph.comm.placement import LayoutTables
from prism.schemas import graph_format as gf
from prism.schemas.pipeline_schedule import Action, one_f_one_b
from prism.schemas.pipeline_shape import PipelineShape

CAPTURED = GPTConfig(layers=8, hidden=64, heads=4, seq_len=16, vocab=256, microbatches=8, tp=2, pp=4, dp=2)
ACT_BYTES = CAPTURED.micro_batch_size * CAPTURED.seq_len * CAPTURED.hidden * 4


def compose(template, *, cfg: GPTConfig, captured: GPTConfig, stage: int) -> StageProgram:
    """``compose_stage`` with the GPT's buckets for the target stage and the template's."""
    buckets = GradBuckets(
        target=stage_buckets(cfg, stage, cfg.itemsize),
        captured=stage_buckets(captured, template.stage, captured.itemsize),
        itemsize=cfg.itemsize,
    )
    shape, captured_shape = (PipelineShape.of_record(c.to_dict()) for c in (cfg, captured))
    return compose_stage(template, shape=shape, captured=captured_shape, stage=stage, buckets=buckets)


class FakeComm:
    """Comm model stand-in: 1 µs per KiB, so durations are easy to check."""

    def durations_ns(self, ops, nbytes, group_size, nodes_spanned, overlap_ns=None, split_volumes=None):
        return (np.asarray(nbytes) // 1024 * 1000).astype(np.int64)


def unit(name: str, phase: str, *, mb: int = -1, layer: int = -1, dur: int = 1000, **comm) -> dict:
    row = {ot.NAME: name, ot.PHASE: phase, ot.MB: mb, ot.LAYER: layer, ot.PART: "", ot.BUCKET: -1, ot.DIR: ""}
    row |= {ot.DUR_NS: dur, ot.GAP_NS: 100, ot.ALLOC_BYTES: 10, ot.FREE_BYTES: 5, ot.IS_COMM: bool(comm)}
    row |= {
        ot.COMM_OP: "",
        ot.GROUP_LABEL: "",
        ot.BYTES: 0,
        ot.SPLIT_BYTES: "",
        ot.DTYPE: "",
        ot.IS_ASYNC: False,
    }
    return row | comm


def comm(op: str, label: str, nbytes: int, *, is_async: bool) -> dict:
    return {
        ot.COMM_OP: op,
        ot.GROUP_LABEL: label,
        ot.BYTES: nbytes,
        ot.DTYPE: "float32",
        ot.IS_ASYNC: is_async,
    }


def block(kind: str, stage: int, mb: int, cfg: GPTConfig) -> list[dict]:
    layers = list(cfg.stage_layers(stage))
    rows = [unit("aten::requires_grad_", "iter")] if kind == "fwd" and stage > 0 else []
    for layer in layers if kind == "fwd" else layers[::-1]:
        rows += [
            unit("aten::linear", kind, mb=mb, layer=layer),
            unit("all_reduce", kind, mb=mb, layer=layer, **comm("all_reduce", "tp.0", 4096, is_async=False)),
            unit("aten::add", kind, mb=mb, layer=layer),
        ]
    return rows


def transfer(action: Action, mb: int) -> list[dict]:
    phase, direction = action.value.split("_")
    op = "send" if phase == "send" else "recv"
    row = unit(op, phase, mb=mb, **comm(op, "world", ACT_BYTES, is_async=True))
    return [unit("aten::empty", phase, mb=mb) | {ot.DIR: direction}, row | {ot.DIR: direction}]


def grad_sync(cfg: GPTConfig, stage: int) -> list[dict]:
    rows = []
    for b in stage_buckets(cfg, stage, 4):
        rows.append(unit("aten::copy_", "grad_sync", dur=b.numel) | {ot.BUCKET: b.index})
        rows.append(
            unit("all_reduce", "grad_sync", **comm("all_reduce", "dp.0", b.numel * 4, is_async=True))
            | {ot.BUCKET: b.index}
        )
    return rows + [unit("aten::div_", "grad_sync")]


def op_table(stage: int, cfg: GPTConfig = CAPTURED, iterations: int = 2) -> pd.DataFrame:
    rows = []
    for it in range(iterations):
        its = [unit("aten::zero_", "iter")]
        for step in one_f_one_b(stage=stage, stages=cfg.pp, microbatches=cfg.microbatches):
            if step.action in (Action.FORWARD, Action.BACKWARD):
                its += block(step.action.value, stage, step.mb, cfg)
            elif step.action != Action.WAIT:
                its += transfer(step.action, step.mb)
        its += grad_sync(cfg, stage) + [unit("Optimizer.step", "optim"), unit("aten::item", "iter")]
        rows += [r | {ot.ITERATION: it} for r in its]
    table = pd.DataFrame(rows)
    table[ot.SEQ] = np.arange(len(table))
    return table


def template(stage: int):
    return build_role_template(
        op_table(stage), rank=CAPTURED.layout.rank(tp=0, dp=0, pp=stage), stage=stage,
        first_layer=CAPTURED.stage_layers(stage).start,
    )  # fmt: skip


def test_segments_follow_the_schedule() -> None:
    iteration = op_table(1).query(f"{ot.ITERATION} == 0")
    kinds = [kind for kind, _, _ in split_segments(iteration)]
    assert kinds[0] == "pre" and kinds[-3:] == ["grad_sync", "optim", "post"]
    expected = [
        {Action.FORWARD: "fwd", Action.BACKWARD: "bwd"}.get(s.action, s.action.value)
        for s in one_f_one_b(stage=1, stages=4, microbatches=8)
        if s.action != Action.WAIT
    ]
    assert kinds[1:-3] == expected


@pytest.mark.parametrize("stage", range(4))
def test_stage_program_is_1f1b_for_pp4_m8(stage: int) -> None:
    role_stage = {0: 0, 3: 3}.get(stage, 1)  # middle stages come from the captured stage 1
    program = compose(template(role_stage), cfg=CAPTURED, captured=CAPTURED, stage=stage).nodes
    layers = list(CAPTURED.stage_layers(stage))
    blocks = program[program[LAYER] >= 0].drop_duplicates([ot.PHASE, MB])[[ot.PHASE, MB]]
    expected = [
        (s.action.value, s.mb) for s in one_f_one_b(stage=stage, stages=4, microbatches=8)
        if s.action in (Action.FORWARD, Action.BACKWARD)
    ]  # fmt: skip
    assert list(blocks.itertuples(index=False, name=None)) == expected
    fwd0 = program[(program[ot.PHASE] == "fwd") & (program[MB] == 0) & (program[LAYER] >= 0)]
    assert list(dict.fromkeys(fwd0[LAYER])) == layers
    # Every asynchronous transfer is waited for by a later wait node.
    waits = program.index[program[ot.NAME] == gf.WAIT_NAME]
    transfers = program.index[(program[P2P_DIR] != 0)]
    waited = {d for w in waits for d in program.at[w, "deps"]}
    assert set(transfers) <= waited and all(d < w for w in waits for d in program.at[w, "deps"])
    assert (program[P2P_DIR] == 1).any() == (stage < 3) and (program[P2P_DIR] == -1).any() == (stage > 0)


def test_more_layers_per_stage_repeat_the_layer_blocks() -> None:
    target = replace(CAPTURED, pp=2)  # 4 layers per stage instead of 2
    program = compose(template(0), cfg=target, captured=CAPTURED, stage=0).nodes
    fwd0 = program[(program[ot.PHASE] == "fwd") & (program[MB] == 0) & (program[LAYER] >= 0)]
    assert list(dict.fromkeys(fwd0[LAYER])) == [0, 1, 2, 3]
    bwd0 = program[(program[ot.PHASE] == "bwd") & (program[MB] == 0) & (program[LAYER] >= 0)]
    assert list(dict.fromkeys(bwd0[LAYER])) == [3, 2, 1, 0]
    tp_calls = program[(program[ot.IS_COMM]) & (program["group_axis"] == "tp")]
    assert len(tp_calls) == 2 * 8 * 4  # fwd + bwd, 8 microbatches, 4 layers
    assert list(tp_calls[GSEQ]) == list(range(len(tp_calls)))
    # The gradient sync carries the target's buckets, and they add up to the stage's parameters.
    dp_bytes = program.loc[program[ot.IS_COMM] & (program["group_axis"] == "dp"), ot.BYTES]
    assert list(dp_bytes) == [b.numel * 4 for b in stage_buckets(target, 0, 4)]


def test_missing_segment_is_a_clear_error() -> None:
    table = op_table(0)
    table = table[table[ot.PHASE] != "grad_sync"]
    tmpl = build_role_template(table, rank=0, stage=0, first_layer=0)
    with pytest.raises(TemplateError, match="never ran a 'grad_sync' segment"):
        compose(tmpl, cfg=CAPTURED, captured=CAPTURED, stage=0)


def test_bound_ranks_share_collective_ids_with_their_group() -> None:
    cfg = CAPTURED
    tables = LayoutTables.build(cfg.layout, gpus_per_node=4)
    encoded = encode_program(compose(template(1), cfg=cfg, captured=cfg, stage=1), cfg.layout)
    ranks = np.array([r for r in range(cfg.layout.world_size) if cfg.layout.stage(r) == 1])
    table = bind_ranks(encoded, ranks, tables, FakeComm()).to_pandas()
    assert list(table[gf.RANK].unique()) == list(ranks)
    coll = table[table[gf.COLL_ID] >= 0]
    for coll_id, members in coll.groupby(gf.COLL_ID)[gf.RANK]:
        kind = coll.loc[coll[gf.COLL_ID] == coll_id, gf.GROUP_KIND].iloc[0]
        assert tuple(sorted(members)) == cfg.layout.group(int(members.iloc[0]), kind)
    sends = table[table[gf.KIND] == "send"]
    assert set(sends[gf.PEER] - sends[gf.RANK]) == {cfg.layout.stride("pp"), -cfg.layout.stride("pp")}
    tp = coll[coll[gf.GROUP_KIND] == "tp"]
    assert (tp[gf.DUR_NS] == 4000).all() and (tp[gf.GROUP_SIZE] == 2).all()


def test_a_dp1_capture_cannot_give_a_gradient_sync() -> None:
    captured = replace(CAPTURED, dp=1)
    table = op_table(0, captured)
    table = table[table[ot.PHASE] != "grad_sync"].reset_index(drop=True)  # dp=1 syncs nothing
    role = build_role_template(table, rank=0, stage=0, first_layer=0)
    compose(role, cfg=captured, captured=captured, stage=0)  # its own layout: fine
    with pytest.raises(TemplateError, match="capture at dp >= 2"):
        compose(role, cfg=replace(captured, dp=8), captured=captured, stage=0)


def test_an_asynchronous_collectives_post_is_not_compute_it_flies_beside() -> None:
    # The post is the call's own host work (its issue, and on CPU the program's thread giving way
    # to the call's work): it runs the call rather than competing with it for the cores.
    def unit(name: str, dur: int, post: int = 0, comm: str = "") -> pd.DataFrame:
        return pd.DataFrame(
            {ot.NAME: [name], ot.PHASE: ["bwd"], ot.DUR_NS: [dur], ot.GAP_NS: [10], ot.POST_NS: [post],
             ot.IS_COMM: [bool(comm)], ot.IS_ASYNC: [bool(comm)], ot.COMM_OP: [comm], P2P_DIR: [0]}
        )  # fmt: skip

    nodes = finish_nodes(
        [unit("all_reduce", 999, post=500, comm="all_reduce"), unit("mm", 300), wait_node([0], "bwd")]
    )
    assert nodes[ot.NAME].tolist() == ["all_reduce", gf.POST_NAME, "mm", gf.WAIT_NAME]
    nodes["group_axis"] = ["dp", "", "", ""]
    _, overlap = waiting_columns(nodes, {"tp": 1, "dp": 2, "world": 2}, 0.0, 0.0)
    assert overlap.tolist() == [300 + 10, 0, 0, 0]  # the mm and its gap, and the wait's gap (0)


def test_a_post_runs_after_its_call_in_the_calls_phase_and_waits_still_name_their_calls() -> None:
    # gloo's post begins the transfer (the calibrated price runs from its start) and the program
    # goes on once the post is done: the post is a node right after its call, never before it.
    def unit(name: str, phase: str, dur: int, post: int = 0, comm: str = "") -> pd.DataFrame:
        return pd.DataFrame(
            {ot.NAME: [name], ot.PHASE: [phase], ot.DUR_NS: [dur], ot.GAP_NS: [10], ot.POST_NS: [post],
             ot.IS_COMM: [bool(comm)], ot.IS_ASYNC: [bool(comm)], ot.COMM_OP: [comm], ot.SEQ: [len(name)],
             P2P_DIR: [1 if comm else 0]}
        )  # fmt: skip

    nodes = finish_nodes(
        [
            unit("send", "send_fwd", 999, post=40, comm="send"),
            unit("mm", "fwd", 100),
            unit("recv", "recv_bwd", 999, post=30, comm="recv"),
            wait_node([0, 2], "p2p_wait"),
        ]
    )
    assert nodes[ot.NAME].tolist() == ["send", gf.POST_NAME, "mm", "recv", gf.POST_NAME, gf.WAIT_NAME]
    assert ot.POST_NS not in nodes
    posts = nodes[nodes[ot.NAME] == gf.POST_NAME]
    assert posts[ot.PHASE].tolist() == ["send_fwd", "recv_bwd"]
    assert posts[ot.DUR_NS].tolist() == [40, 30] and (posts[ot.GAP_NS] == 0).all()
    assert not posts[ot.IS_COMM].any() and not posts[ot.IS_ASYNC].any()
    assert posts[ot.SEQ].tolist() == [4, 4]  # the call it posts
    assert nodes[ot.GAP_NS].tolist() == [10, 0, 10, 10, 0, 0]  # the calls' own gaps unchanged
    assert nodes[DEPS].iloc[-1] == [0, 3]  # the wait still names the two calls
    assert nodes[P2P_SEQ].tolist()[0] == 0 and nodes[P2P_SEQ].tolist()[3] == 0
