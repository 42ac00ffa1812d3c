"""Graphs whose ranks have several streams (format version 4): a GPU rank's CPU thread and GPU
streams as lanes, dependencies across them with lags, read, validated and simulated."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_simulate import DEFAULTS, collective, compute, config

from prism.graph.export.chakra import rank_nodes
from prism.graph.export.trace import ExportError, rank_trace
from prism.graph.io.parquet import GraphReader, GraphWriter
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.predict import predict
from prism.graph.sim.simulate import SimulationError, simulate
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata

LAUNCH_NS = 20


def on(stream: int, index: int, lag: int = 0) -> dict:
    return {gf.LANE_DEP_STREAM: stream, gf.LANE_DEP_INDEX: index, gf.LANE_DEP_LAG_NS: lag}


def gpu_rank(kernel_ns: int) -> list[list[dict]]:
    """A CPU thread that launches a kernel and an NCCL all-reduce, then synchronizes; a GPU stream
    that runs them, each no earlier than its launch's end plus the launch latency."""
    cpu = [compute(10), compute(10), compute(5, **{gf.LANE_DEPS: [on(1, 1)]})]
    gpu = [
        compute(kernel_ns, **{gf.LANE_DEPS: [on(0, 0, LAUNCH_NS)]}),
        collective(7, 50, 2, **{gf.LANE_DEPS: [on(0, 1, LAUNCH_NS)], gf.GROUP_INDEX: 0}),
    ]
    return [cpu, gpu]


def metadata(version: int = gf.VERSION) -> GraphMetadata:
    cfg = config(tp=2)
    return GraphMetadata(
        layout=cfg.layout.to_dict(), model=cfg.to_dict(), cluster={}, capture_digest="0" * 64,
        build_options={}, prism_version="test", version=version,
        extra={gf.STREAMS_KEY: ["main thread", "cuda stream 7"], gf.STATIC_BYTES_KEY: [0]},
    )  # fmt: skip


def rows(ranks: list[list[list[dict]]]) -> pa.Table:
    out = [
        {**DEFAULTS, **node, gf.RANK: rank, gf.STREAM: stream, gf.INDEX: i, gf.STAGE: 0}
        for rank, streams in enumerate(ranks)
        for stream, nodes in enumerate(streams)
        for i, node in enumerate(nodes)
    ]
    schema = pa.schema([f.with_type(pa.string()) if pa.types.is_dictionary(f.type) else f for f in gf.SCHEMA])
    return pa.Table.from_pylist(out, schema=schema).cast(gf.SCHEMA)


def write(path: Path, ranks: list[list[list[dict]]]) -> Path:
    with GraphWriter(path, metadata(), ranks_per_row_group=1) as writer:
        writer.write_ranks(rows(ranks))
    return path


def test_gpu_lanes_wait_for_launches_collectives_and_syncs(tmp_path: Path) -> None:
    path = write(tmp_path / "g.parquet", [gpu_rank(100), gpu_rank(300)])
    graph = load_sim_graph(path)
    assert graph.lanes == 4 and graph.ranks == 2 and list(graph.lane_rank) == [0, 0, 1, 1]
    result = simulate(graph, iterations=2)
    # Rank 0's kernel runs 30-130 (launch ended at 10, + 20), rank 1's 30-330; the all-reduce
    # starts on both streams when the later one arrives (330) and ends at 380; each CPU thread's
    # synchronize returns 5 ns after that.
    for rank, kernel_end in ((0, 130), (1, 330)):
        first = int(graph.rank_first_row()[rank])
        cpu, gpu = slice(first, first + 3), slice(first + 3, first + 5)
        start = result.start_ns - result.rank_start_ns[rank]
        end = result.end_ns - result.rank_start_ns[rank]
        assert list(start[gpu]) == [30, kernel_end]
        assert list(end[gpu]) == [kernel_end, 380]
        assert list(start[cpu]) == [0, 10, 380] and list(end[cpu]) == [10, 20, 385]
    # The CPU thread waits for its GPU each pass: both streams keep its pace.
    assert list(result.iteration_ns) == [385, 385]
    assert list(result.rank_start_ns) == [385, 385]
    summary = predict(path)
    assert summary.ranks["iteration_ns"] == [385, 385]
    assert summary.ranks["stage"] == [0, 0]
    assert validate_graph(path).ok
    # Its exported trace: a thread row a stream, named as the graph names them.
    events = rank_trace(path, 1)["traceEvents"]
    assert {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"} == {
        1: "main thread",
        2: "cuda stream 7",
    }
    spans = sorted((e["tid"], e["ts"], e["dur"]) for e in events if e["ph"] == "X")
    assert spans == [(1, 0.385, 0.01), (1, 0.395, 0.01), (1, 0.765, 0.005), (2, 0.415, 0.3), (2, 0.715, 0.05)]
    with pytest.raises(ExportError, match="dependencies across its streams"):
        rank_nodes(path, 0)


@pytest.mark.parametrize(
    "dep", [on(1, 9), on(0, 0), on(3, 0)], ids=["past-the-stream", "own-stream", "no-stream"]
)
def test_a_lane_dependency_on_no_node_of_another_stream_is_refused(tmp_path: Path, dep: dict) -> None:
    bad = gpu_rank(100)
    bad[0][2] = compute(5, **{gf.LANE_DEPS: [dep]})  # on the CPU thread; the GPU stream has 2 nodes
    path = write(tmp_path / "g.parquet", [bad, gpu_rank(100)])
    with pytest.raises(SimulationError, match="lane dependency on no node"):
        load_sim_graph(path)
    report = validate_graph(path)
    assert not report.ok
    where = f"lane_deps entry (stream {dep[gf.LANE_DEP_STREAM]}, index {dep[gf.LANE_DEP_INDEX]})"
    assert any(where in p for p in report.problems)


def test_streams_the_metadata_does_not_name_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    unnamed = GraphMetadata(**{**metadata().__dict__, "extra": {gf.STATIC_BYTES_KEY: [0]}})
    with pytest.raises(ValueError, match="names no streams"), GraphWriter(path, unnamed) as writer:
        writer.write_ranks(rows([gpu_rank(100), gpu_rank(100)]))
    assert not path.exists()
    # Streams beyond 0 without their names (and so without lane dependencies): refused on reading.
    with GraphWriter(path, unnamed, ranks_per_row_group=1) as writer:
        writer.write_ranks(rows([gpu_rank(100), gpu_rank(100)]).drop_columns([gf.LANE_DEPS]))
    assert gf.LANE_DEPS not in pq.read_schema(path).names
    with pytest.raises(SimulationError, match="streams the metadata does not name"):
        load_sim_graph(path)
    assert any("names no streams" in p for p in validate_graph(path).problems)


def test_a_file_of_version_3_reads_with_no_lane_dependency(tmp_path: Path) -> None:
    tp = {gf.GROUP_INDEX: 0}
    one_stream = [
        [compute(100), collective(7, 50, 2, **tp), compute(10)],
        [compute(300), collective(7, 50, 2, **tp), compute(10)],
    ]
    table = rows([[nodes] for nodes in one_stream]).drop_columns([gf.LANE_DEPS])
    schema = table.schema.with_metadata({gf.METADATA_KEY: metadata(version=3).to_bytes()})
    path = tmp_path / "v3.parquet"
    pq.write_table(table.replace_schema_metadata(schema.metadata), path, row_group_size=3)
    with GraphReader(path) as reader:
        assert reader.read_rank(1)[gf.LANE_DEPS].to_pylist() == [[], [], []]
    graph = load_sim_graph(path)
    assert graph.lane_rank is None and graph.deps_lag is None
    assert list(simulate(graph, iterations=1).iteration_ns) == [360, 360]
    assert validate_graph(path).ok
    # A graph of version 4 with one stream a rank leaves the column out too, as prism writes it.
    one = GraphMetadata(**{**metadata().__dict__, "extra": {gf.STATIC_BYTES_KEY: [0]}})
    with GraphWriter(tmp_path / "v4.parquet", one, ranks_per_row_group=1) as writer:
        writer.write_ranks(table)
    assert gf.LANE_DEPS not in pq.read_schema(tmp_path / "v4.parquet").names
    assert list(simulate(load_sim_graph(tmp_path / "v4.parquet"), iterations=1).iteration_ns) == [360, 360]
    # One that names its streams must have the column.
    schema = table.schema.with_metadata({gf.METADATA_KEY: metadata().to_bytes()})
    pq.write_table(table.replace_schema_metadata(schema.metadata), path, row_group_size=3)
    with pytest.raises(ValueError, match="column 'lane_deps' is missing"):
        load_sim_graph(path)


@pytest.mark.parametrize(
    ("cpu_ns", "kernel_ns", "period"),
    [(90, 50, 100), (10, 150, 150)],
    ids=["gpu-behind-keeps-up", "gpu-bound"],
)
def test_each_stream_starts_a_pass_when_it_is_free(
    tmp_path: Path, cpu_ns: int, kernel_ns: int, period: int
) -> None:
    """A CPU thread that launches a kernel as its step ends and never waits for it: the GPU runs
    behind, and a rank's iteration is the pace of its slowest stream, not the first pass's last end."""
    cpu = [compute(cpu_ns), compute(10)]
    gpu = [compute(kernel_ns, **{gf.LANE_DEPS: [on(0, 1, LAUNCH_NS)]})]
    graph = load_sim_graph(write(tmp_path / "g.parquet", [[cpu, gpu], [cpu, gpu]]))  # two alike ranks
    first = simulate(graph, iterations=1)
    assert first.end_ns.max() == cpu_ns + 10 + LAUNCH_NS + kernel_ns  # the kernel outlives the CPU's step
    steady = simulate(graph, iterations=3)
    assert list(steady.iteration_ns) == [period, period]
    # The last pass's kernel started when launched, or when its stream was free.
    launched = steady.lane_start_ns[0] + cpu_ns + 10 + LAUNCH_NS
    assert steady.start_ns[2] == max(launched, steady.lane_start_ns[1])
