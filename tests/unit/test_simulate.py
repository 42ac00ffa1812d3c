"""The simulation on hand-built graphs whose answers are known."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.params import static_bytes
from prism.graph.io.parquet import GraphFormatError, GraphWriter
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import SimulationError, simulate
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata, NodeKind
from prism.schemas.pipeline_schedule import Action, one_f_one_b
from tests.graph_files import with_metadata

DEFAULTS = {
    gf.STREAM: 0, gf.PHASE: "", gf.MB: -1, gf.LAYER: -1, gf.PART: "", gf.DUR_NS: 0, gf.GAP_NS: 0, gf.SKEW_NS: 0,
    gf.COLL_ID: -1, gf.GROUP_KIND: "", gf.GROUP_INDEX: -1, gf.GROUP_SIZE: 0, gf.PEER: -1, gf.P2P_SEQ: -1,
    gf.BYTES: 0, gf.DTYPE: "", gf.IS_ASYNC: False, gf.ALLOC_BYTES: 0, gf.FREE_BYTES: 0, gf.DEPS: [],
    gf.SRC_RANK: 0, gf.SRC_OP: 0, gf.NAME: "op", gf.LANE_DEPS: [], gf.SPLIT_BYTES: [],
}  # fmt: skip


def config(tp: int = 1, pp: int = 1, dp: int = 1, microbatches: int = 4) -> GPTConfig:
    return GPTConfig(
        layers=2 * pp, hidden=8, heads=2, vocab=16, seq_len=4, microbatches=microbatches, tp=tp, pp=pp, dp=dp
    )


def compute(dur: int, **more: object) -> dict:
    return {gf.KIND: NodeKind.COMPUTE.value, gf.DUR_NS: dur, **more}


def collective(coll_id: int, dur: int, size: int, **more: object) -> dict:
    return {gf.KIND: NodeKind.COLLECTIVE.value, gf.COLL_ID: coll_id, gf.DUR_NS: dur, gf.GROUP_KIND: "tp", gf.GROUP_SIZE: size, **more}  # fmt: skip


def transfer(kind: NodeKind, peer: int, seq: int, dur: int) -> dict:
    return {
        gf.KIND: kind.value,
        gf.PEER: peer,
        gf.P2P_SEQ: seq,
        gf.DUR_NS: dur,
        gf.IS_ASYNC: True,
        gf.GROUP_SIZE: 2,
    }


def write(path: Path, cfg: GPTConfig, programs: list[list[dict]]) -> Path:
    meta = GraphMetadata(
        layout=cfg.layout.to_dict(), model=cfg.to_dict(), cluster={}, capture_digest="0" * 64,
        build_options={}, prism_version="test",
        extra={gf.STATIC_BYTES_KEY: [static_bytes(cfg, s) for s in range(cfg.pp)]},
    )  # fmt: skip
    schema = pa.schema([f.with_type(pa.string()) if pa.types.is_dictionary(f.type) else f for f in gf.SCHEMA])
    with GraphWriter(path, meta, ranks_per_row_group=2) as writer:
        for rank, nodes in enumerate(programs):
            rows = [
                {**DEFAULTS, **n, gf.RANK: rank, gf.INDEX: i, gf.STAGE: cfg.layout.stage(rank)}
                for i, n in enumerate(nodes)
            ]
            writer.write_ranks(pa.Table.from_pylist(rows, schema=schema).cast(gf.SCHEMA))
    return path


def test_collective_waits_for_its_slowest_member(tmp_path: Path) -> None:
    cfg = config(tp=2)
    programs = [
        [compute(100), collective(7, 50, 2), compute(10)],
        [compute(300), collective(7, 50, 2), compute(10)],
    ]
    result = simulate(load_sim_graph(write(tmp_path / "g.parquet", cfg, programs)), iterations=1)
    assert list(result.start_ns) == [0, 100, 350, 0, 300, 350]
    assert list(result.end_ns) == [100, 350, 360, 300, 350, 360]
    assert list(result.iteration_ns) == [360, 360]


def test_collective_skew_is_waited_for_by_every_member(tmp_path: Path) -> None:
    cfg = config(tp=2)
    skewed = {gf.SKEW_NS: 40}
    programs = [
        [compute(100), collective(7, 50, 2, **skewed), compute(10)],
        [compute(300), collective(7, 50, 2, **skewed), compute(10)],
    ]
    result = simulate(load_sim_graph(write(tmp_path / "g.parquet", cfg, programs)), iterations=1)
    assert list(result.end_ns) == [100, 390, 400, 300, 390, 400]  # last arrival 300 + 50 + 40


def test_send_recv_chain_with_gaps(tmp_path: Path) -> None:
    cfg = config(pp=3, microbatches=3)

    def wait(dep: int) -> dict:
        return compute(0, **{gf.DEPS: [dep]})

    programs = [
        [compute(100), transfer(NodeKind.SEND, 1, 0, 20), wait(1)],
        [transfer(NodeKind.RECV, 0, 0, 20), wait(0), compute(50, **{gf.GAP_NS: 5}), transfer(NodeKind.SEND, 2, 0, 30), wait(3)],
        [transfer(NodeKind.RECV, 1, 0, 30), wait(0), compute(10)],
    ]  # fmt: skip
    result = simulate(load_sim_graph(write(tmp_path / "g.parquet", cfg, programs)), iterations=1)
    # rank 1 computes from 125 (transfer ends at 120, then a 5 ns gap) to 175; its send runs to 205.
    assert list(result.iteration_ns) == [120, 205, 215]


def one_f_one_b_programs(pp: int, m: int, f: int, b: int) -> list[list[dict]]:
    programs = []
    for stage in range(pp):
        nodes: list[dict] = []
        pending: list[int] = []
        seq = {
            Action.SEND_FORWARD: 0,
            Action.RECV_FORWARD: 0,
            Action.SEND_BACKWARD: 0,
            Action.RECV_BACKWARD: 0,
        }
        for step in one_f_one_b(stage=stage, stages=pp, microbatches=m):
            if step.action == Action.FORWARD:
                nodes.append(compute(f))
            elif step.action == Action.BACKWARD:
                nodes.append(compute(b))
            elif step.action == Action.WAIT:
                nodes.append(compute(0, **{gf.DEPS: pending}))
                pending = []
            else:
                peer = stage + (1 if step.action in (Action.SEND_FORWARD, Action.RECV_BACKWARD) else -1)
                kind = (
                    NodeKind.SEND
                    if step.action in (Action.SEND_FORWARD, Action.SEND_BACKWARD)
                    else NodeKind.RECV
                )
                pending.append(len(nodes))
                nodes.append(transfer(kind, peer, seq[step.action], 0))
                seq[step.action] += 1
        programs.append(nodes)
    return programs


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8)])
def test_1f1b_pipeline_takes_m_plus_p_minus_1_slots(tmp_path: Path, pp: int, m: int) -> None:
    f, b = 10, 20
    cfg = config(pp=pp, microbatches=m)
    graph = load_sim_graph(write(tmp_path / "g.parquet", cfg, one_f_one_b_programs(pp, m, f, b)))
    first = simulate(graph, iterations=1)
    assert first.iteration_ns[0] == (m + pp - 1) * (f + b)  # the first stage finishes last
    # The cool-down is backward-only: each stage ends one backward before the stage before it.
    assert list(first.iteration_ns) == [(m + pp - 1) * (f + b) - s * b for s in range(pp)]
    steady = simulate(graph, iterations=3)
    assert (steady.iteration_ns == (m + pp - 1) * (f + b)).all()


def test_slow_rank_delays_its_group_only(tmp_path: Path) -> None:
    cfg = config(tp=2, dp=2)  # ranks 0,1 and 2,3 are TP groups
    programs = [[compute(d), collective(10 + r // 2, 5, 2)] for r, d in enumerate([100, 100, 100, 400])]
    result = simulate(load_sim_graph(write(tmp_path / "g.parquet", cfg, programs)), iterations=1)
    assert list(result.iteration_ns) == [105, 105, 405, 405]


def test_peak_memory_replays_allocations_on_top_of_the_recorded_static_bytes(tmp_path: Path) -> None:
    cfg = config()
    nodes = [
        compute(1, **{gf.ALLOC_BYTES: 100}),
        compute(1, **{gf.ALLOC_BYTES: 50, gf.FREE_BYTES: 30}),
        compute(1, **{gf.FREE_BYTES: 120}),
    ]
    result = simulate(load_sim_graph(write(tmp_path / "g.parquet", cfg, [nodes])), iterations=1)
    assert result.peak_bytes[0] == static_bytes(cfg, 0) + 150
    # Weights, grads and two Adam moments (float32), plus a 4-byte step counter per tensor. By hand:
    # embedding 16*8 + 4*8 = 160; per layer 16 + 216 + 72 + 16 + 288 + 264 = 872, two layers;
    # head 8 + 8 + 16*8 = 144: 2048 parameters in 2 + 2*12 + 3 = 29 tensors.
    assert static_bytes(cfg, 0) == 4 * 4 * 2048 + 4 * 29


def test_deadlock_is_reported(tmp_path: Path) -> None:
    cfg = config(tp=2)
    programs = [[collective(1, 5, 2), collective(2, 5, 2)], [collective(2, 5, 2), collective(1, 5, 2)]]
    with pytest.raises(SimulationError, match="deadlock: 2 rank"):
        simulate(load_sim_graph(write(tmp_path / "g.parquet", cfg, programs)), iterations=1)


def test_breakdown_adds_up_and_finds_the_1f1b_bubble(tmp_path: Path) -> None:
    from prism.graph.sim.metrics import breakdown, critical_path

    pp, m, f, b = 4, 8, 10, 20
    graph = load_sim_graph(
        write(tmp_path / "g.parquet", config(pp=pp, microbatches=m), one_f_one_b_programs(pp, m, f, b))
    )
    result = simulate(graph, iterations=3)
    parts = breakdown(graph, result)
    total = parts.compute_ns + parts.overhead_ns + parts.exposed_comm_ns + parts.bubble_ns
    assert list(total) == list(result.iteration_ns)
    assert (parts.compute_ns == m * (f + b)).all()
    assert (parts.bubble_ns == (pp - 1) * (f + b)).all()  # the textbook 1F1B bubble
    path = critical_path(graph, result)
    ranks = np.searchsorted(graph.rank_ptr, path, side="right") - 1
    assert len(set(ranks)) == pp  # the chain goes down the pipeline and back
    # With free transfers and no gaps, compute on the path fills it without a hole.
    on_path = graph.dur[path][graph.kind[path] == 0].sum()
    assert path[-1] == np.argmax(result.end_ns)
    assert on_path == result.end_ns[path[-1]] - result.start_ns[path[0]]


def test_exposed_comm_is_the_wait_for_a_slow_member(tmp_path: Path) -> None:
    from prism.graph.sim.metrics import breakdown

    cfg = config(tp=2)
    programs = [[compute(100, **{gf.GAP_NS: 7}), collective(7, 50, 2)], [compute(300), collective(7, 50, 2)]]
    graph = load_sim_graph(write(tmp_path / "g.parquet", cfg, programs))
    parts = breakdown(graph, simulate(graph, iterations=1))
    assert list(parts.exposed_comm_ns) == [50 + 193, 50]
    assert list(parts.overhead_ns) == [7, 0] and list(parts.bubble_ns) == [0, 0]


def test_exact_regression_on_the_checked_in_tiny_graph() -> None:
    """tests/data/tiny_graph.parquet (see tests/data/README.md): the engine's answer must not drift."""
    graph = load_sim_graph(Path(__file__).parents[1] / "data" / "tiny_graph.parquet")
    result = simulate(graph, iterations=2)
    assert len(graph.kind) == 3872
    assert graph.skew is not None and int(graph.skew.sum()) == 8660316
    assert result.iteration_ns.tolist() == [12449966] * 8
    assert result.peak_bytes.tolist() == [220056] * 4 + [185932] * 4


@pytest.mark.parametrize(
    ("node", "says"),
    [
        ({gf.DEPS: [5]}, "dependency on no earlier node"),  # past the end of its rank
        ({gf.DEPS: [1]}, "dependency on no earlier node"),  # itself
        ({gf.DUR_NS: -1}, "negative dur_ns"),
        ({gf.GAP_NS: -5}, "negative gap_ns"),
        ({gf.FREE_BYTES: -8}, "negative free_bytes"),
    ],
)
def test_a_damaged_graph_is_refused_on_load(tmp_path: Path, node: dict, says: str) -> None:
    programs = [[compute(10), compute(20, **node), compute(30)]]
    with pytest.raises(SimulationError, match=says):
        load_sim_graph(write(tmp_path / "g.parquet", config(), programs))


def test_durations_that_would_overflow_the_clock_are_refused(tmp_path: Path) -> None:
    programs = [[compute(10), compute(2**61), compute(2**61)]]
    graph = load_sim_graph(write(tmp_path / "g.parquet", config(), programs))
    with pytest.raises(SimulationError, match="would overflow"):
        simulate(graph, iterations=2)


def test_a_collective_missing_a_member_is_refused_on_load(tmp_path: Path) -> None:
    programs = [
        [compute(100), collective(7, 50, 2)],
        [compute(300), compute(50)],  # rank 1's member of collective 7 was lost
    ]
    with pytest.raises(SimulationError, match="1 member node"):
        load_sim_graph(write(tmp_path / "g.parquet", config(tp=2), programs))


def _as_world_of_4(path: Path, keep: list[int]) -> Path:
    """``path``'s rows of the ranks ``keep``, its metadata's layout changed to dp=4."""

    def world_of_4(metadata: dict) -> None:
        metadata["layout"]["dp"] = metadata["model"]["dp"] = 4

    return with_metadata(path, path, world_of_4, ranks=keep)


def test_metadata_that_claims_more_ranks_than_the_rows_hold_is_refused_on_load(tmp_path: Path) -> None:
    # A world of 4 in the metadata, rows for fewer: the others would simulate as idle ranks, exit 0.
    short = write(tmp_path / "short.parquet", config(dp=2), [[compute(100)], [compute(200)]])
    with pytest.raises(GraphFormatError, match="its rows end at rank 1, its metadata's layout has 4 ranks"):
        load_sim_graph(_as_world_of_4(short, keep=[0, 1]))
    holed = write(
        tmp_path / "holed.parquet", config(dp=4), [[compute(1)], [compute(2)], [compute(3)], [compute(4)]]
    )
    with pytest.raises(SimulationError, match="rank 2 of the metadata's world of 4 has no node"):
        load_sim_graph(_as_world_of_4(holed, keep=[0, 1, 3]))


@pytest.mark.parametrize(
    ("sender", "receiver", "says"),
    [
        ({gf.PEER: 5}, {}, "a peer outside the world"),  # world 2: would alias another pair's key
        ({gf.PEER: 0}, {}, "a peer outside the world, itself"),
        ({gf.P2P_SEQ: -1}, {}, "no sequence number"),
        ({gf.P2P_SEQ: 1}, {}, "no matching partner"),
        ({}, {gf.KIND: NodeKind.SEND.value}, "no matching partner"),  # a send each way, no recv
    ],
)
def test_a_transfer_without_its_partner_is_refused_on_load(
    tmp_path: Path, sender: dict, receiver: dict, says: str
) -> None:
    programs = [
        [compute(10), {**transfer(NodeKind.SEND, 1, 0, 5), **sender}],
        [{**transfer(NodeKind.RECV, 0, 0, 5), **receiver}, compute(10)],
    ]
    with pytest.raises(SimulationError, match=says):
        load_sim_graph(write(tmp_path / "g.parquet", config(pp=2), programs))


def test_two_sends_of_one_transfer_are_not_a_pair(tmp_path: Path) -> None:
    send = transfer(NodeKind.SEND, 1, 0, 5)
    programs = [[send, send], [compute(10)]]  # (0 -> 1, 0) twice and no recv: two members, no receiver
    with pytest.raises(SimulationError, match="no matching partner"):
        load_sim_graph(write(tmp_path / "g.parquet", config(pp=2), programs))


def test_an_unknown_node_kind_or_stage_is_refused_on_load(tmp_path: Path) -> None:
    with pytest.raises(SimulationError, match="unknown node kind.*'barrier'"):
        load_sim_graph(write(tmp_path / "a.parquet", config(), [[compute(10), {gf.KIND: "barrier"}]]))
    graph = write(tmp_path / "b.parquet", config(), [[compute(10), compute(5)]])
    table = pa.parquet.read_table(graph)
    stage = table.column(gf.STAGE).to_pylist()
    stage[1] = 3  # the layout has one stage
    with pytest.raises(SimulationError, match="stage outside the layout's 0..0"):
        edited = table.set_column(
            table.schema.get_field_index(gf.STAGE), gf.STAGE, pa.array(stage, pa.int16())
        )
        pa.parquet.write_table(edited, tmp_path / "c.parquet")
        load_sim_graph(tmp_path / "c.parquet")
