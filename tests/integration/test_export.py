"""prism-export trace: any rank of a graph as a Chrome/Perfetto trace that HTA loads beside the
traces of captured and replayed ranks (and the virtual neighbours a replay traces)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prism.graph.export.cli import app as export_app
from prism.graph.io.parquet import read_rank
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.replay.cli import app as replay_app
from prism.schemas import graph_format as gf
from prism.schemas.manifest import CaptureFiles
from prism.schemas.replay import ReplayFiles


def export(graph: Path, rank: int, out: Path) -> dict:
    result = CliRunner().invoke(export_app, ["trace", str(graph), "--rank", str(rank), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(gzip.decompress(out.read_bytes()) if out.suffix == ".gz" else out.read_text())


def test_a_virtual_rank_is_its_simulated_steady_iteration(fuzz_graph: Path, tmp_path: Path) -> None:
    trace = export(fuzz_graph, 2, tmp_path / "rank2.json.gz")
    info = trace["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (2, 4)
    assert [0, 1, 2, 3] in [g["ranks"] for g in info["pg_config"]]  # the world
    assert any(2 in g["ranks"] and g["pg_size"] == 2 for g in info["pg_config"])  # its dp and pp groups
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    nodes = read_rank(fuzz_graph, 2, columns=[gf.KIND, gf.DUR_NS]).to_pydict()
    assert len(spans) == len(nodes[gf.KIND])  # one event per node of the rank
    compute = [e for e in spans if e["cat"] == "cpu_op"]
    modelled = sum(d for k, d in zip(nodes[gf.KIND], nodes[gf.DUR_NS], strict=True) if k == "compute")
    assert sum(e["dur"] for e in compute) == pytest.approx(
        modelled / 1e3, rel=1e-6
    )  # compute runs its duration
    assert any(e["name"].startswith("prism:comm all_reduce dp.") for e in spans)
    starts = [e["ts"] for e in spans]
    assert starts == sorted(starts)
    iteration_us = simulate(load_sim_graph(fuzz_graph), iterations=2).iteration_ns[2] / 1e3
    span_us = max(e["ts"] + e["dur"] for e in spans) - min(starts)
    assert 0.5 * iteration_us < span_us <= iteration_us + 1e-3  # within its steady iteration


def test_hta_loads_captured_replayed_exported_and_peer_ranks_together(
    fuzz_capture: Path, fuzz_graph: Path, tmp_path: Path
) -> None:
    from hta.trace_analysis import TraceAnalysis

    replay = tmp_path / "replay"
    argv = [
        str(fuzz_graph),
        "--rank",
        "1",
        "--trace-peers",
        "3",
        "--warmup",
        "3",
        "--iterations",
        "1",
        "-o",
        str(replay),
    ]
    result = CliRunner().invoke(replay_app, argv)
    assert result.exit_code == 0, result.output
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(CaptureFiles(fuzz_capture).kineto(0), traces / "rank0.captured.json.gz")
    shutil.copy(ReplayFiles(replay).kineto(1), traces / "rank1.replayed.json.gz")
    export(fuzz_graph, 2, traces / "rank2.simulated.json.gz")
    shutil.copy(ReplayFiles(replay).peer_trace(3), traces / "rank3.peer.json")
    analysis = TraceAnalysis(trace_dir=str(traces))
    assert sorted(analysis.t.traces) == [0, 1, 2, 3]
    for rank, frame in analysis.t.traces.items():
        assert (frame["dur"] > 0).sum() > 100, rank  # its ops (instant events have dur -1)
    nodes = len(read_rank(fuzz_graph, 2, columns=[gf.KIND]))
    assert len(analysis.t.traces[2]) == nodes


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--rank", "9"], "rank 9 is not in the graph (0..3)"),
        (["--rank", "1", "-o", "{tmp}"], "is a directory"),
    ],
)
def test_export_errors_are_one_line(fuzz_graph: Path, tmp_path: Path, argv: list[str], says: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "-o" not in argv:
        argv += ["-o", str(tmp_path / "t.json")]
    result = CliRunner().invoke(export_app, ["trace", str(fuzz_graph), *argv])
    assert result.exit_code == 2 and says in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def _read_chakra(path: Path) -> tuple[object, list]:
    """A Chakra trace read back with mlc-chakra's own reader."""
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata, Node
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    f = openFileRd(str(path))
    metadata = GlobalMetadata()
    assert decodeMessage(f, metadata)
    nodes = []
    while True:
        node = Node()
        if not decodeMessage(f, node):
            break
        nodes.append(node)
    f.close()
    return metadata, nodes


def test_chakra_traces_read_back_with_mlc_chakra(fuzz_graph: Path, tmp_path: Path) -> None:
    from chakra.schema.protobuf.et_def_pb2 import COMM_COLL_NODE, COMM_RECV_NODE, COMM_SEND_NODE, COMP_NODE

    out = tmp_path / "et"
    result = CliRunner().invoke(export_app, ["chakra", str(fuzz_graph), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "comm_group.json").read_text()) == {
        "world": [0, 1, 2, 3],
        "dp.0": [0, 1],
        "dp.1": [2, 3],
    }  # fmt: skip (tp=1 pp=2 dp=2, order tp-dp-pp: the all-reduces' groups; stages send and receive)
    sends, recvs = set(), set()
    for rank in range(4):
        metadata, nodes = _read_chakra(out / f"prism.{rank}.et")
        assert {a.name: a.int64_val for a in metadata.attr if a.name.startswith("prism_")} == {
            "prism_rank": rank, "prism_world_size": 4
        }  # fmt: skip
        graph = read_rank(fuzz_graph, rank, columns=[gf.KIND, gf.DUR_NS, gf.GAP_NS, gf.BYTES]).to_pydict()
        calls = [k for k, kind in enumerate(graph[gf.KIND]) if kind != "compute"]
        gaps = sum(1 for k in calls if graph[gf.GAP_NS][k] > 0)
        assert len(nodes) == len(graph[gf.KIND]) + gaps  # a node per graph node, a gap node per idle call
        assert [n.id for n in nodes] == list(range(len(nodes)))
        for n in nodes:
            assert all(d < n.id for d in [*n.data_deps, *n.ctrl_deps])  # dependencies point back
        total_us = sum(n.duration_micros for n in nodes if n.type == COMP_NODE)
        graph_us = sum(d + g for kind, d, g in zip(graph[gf.KIND], graph[gf.DUR_NS], graph[gf.GAP_NS], strict=True)
                       if kind == "compute") / 1e3 + sum(graph[gf.GAP_NS][k] for k in calls) / 1e3  # fmt: skip
        assert total_us == pytest.approx(graph_us, abs=len(nodes))  # µs rounding, at most half a µs a node
        comm = [n for n in nodes if n.type in (COMM_COLL_NODE, COMM_SEND_NODE, COMM_RECV_NODE)]
        attrs = [{a.name: a for a in n.attr} for n in comm]
        assert [a["comm_size"].int64_val for a in attrs] == [graph[gf.BYTES][k] for k in calls]
        for n, a in zip(comm, attrs, strict=True):
            if n.type == COMM_COLL_NODE:
                assert a["comm_type"].int64_val == 0 and a["pg_name"].string_val in (
                    "dp.0",
                    "dp.1",
                )  # all_reduce
            else:
                key = (a["comm_src"].int32_val, a["comm_dst"].int32_val, a["comm_tag"].int32_val)
                (sends if n.type == COMM_SEND_NODE else recvs).add(key)
    assert sends and sends == recvs  # every send has its receive in the peer's trace


def test_chakra_export_refuses_what_it_cannot_write(fuzz_graph: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    for argv, says in [
        (["-o", str(taken)], "not an empty directory"),
        (["-o", str(tmp_path / "et"), "--ranks", "4"], "rank 4 is not in the graph"),
        (["-o", str(tmp_path / "et"), "--ranks", "x"], "not a comma-separated list"),
    ]:
        result = CliRunner().invoke(export_app, ["chakra", str(fuzz_graph), *argv])
        assert result.exit_code == 2 and says in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert (taken / "mine.txt").read_text() == "keep"
