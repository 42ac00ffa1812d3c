"""A program's graph at another data-parallel degree than the one captured: the graph a capture
at that degree gives (nodes, prices, memory), replayed with the program; a sharded axis refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prism.graph.build.cli import app as build_app
from prism.graph.io.parquet import read_metadata
from prism.graph.sim.load import graph_column, load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.replay.cli import app as replay_app
from prism.schemas import graph_format as gf
from tests.integration.programs import built_with, captured_and_built, replayed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ("--steps", "50", "--hidden", "32", "--layers", "2", "--vocab", "64", "--batch", "2", "--seq", "8")
DDP = (str(EXAMPLES / "ddp.py"), *TINY)
runner = CliRunner()


def hsdp(replicas: int) -> tuple[str, ...]:
    return (str(EXAMPLES / "fsdp2.py"), *TINY, "--replicate", str(replicas))


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """DDP captured at dp=2 and built at 8, and its graph captured at dp=8."""
    root = tmp_path_factory.mktemp("ddp_dp")
    capture, _ = captured_and_built(root / "at2", ("--dp", "2"), DDP)
    _, direct = captured_and_built(root / "at8", ("--dp", "8"), DDP)
    return built_with(capture, root / "at2-built-at8.parquet", "--dp", "8"), direct


@pytest.fixture(scope="module")
def hsdp_graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """HSDP of 2 replicas of 2 shards captured, built at 8 replicas, and captured at 8."""
    root = tmp_path_factory.mktemp("hsdp_dp")
    capture, _ = captured_and_built(root / "r2", ("--dp-replicate", "2", "--dp-shard", "2"), hsdp(2))
    _, direct = captured_and_built(root / "r8", ("--dp-replicate", "8", "--dp-shard", "2"), hsdp(8))
    return capture, built_with(capture, root / "r2-built-r8.parquet", "--dp-replicate", "8"), direct


def _nodes(graph: Path, rank: int) -> list[tuple]:
    """A rank's nodes: kind, name, phase, payload, group kind and size, in program order."""
    columns = (gf.KIND, gf.NAME, gf.PHASE, gf.BYTES, gf.GROUP_KIND, gf.GROUP_SIZE)
    return list(zip(*(graph_column(graph, c, np.array([rank])).tolist() for c in columns), strict=True))


def _collective_prices(graph: Path, rank: int) -> np.ndarray:
    ranks = np.array([rank])
    kind = graph_column(graph, gf.KIND, ranks)
    return graph_column(graph, gf.DUR_NS, ranks)[kind == gf.NodeKind.COLLECTIVE.value]


def _peaks(graph: Path) -> np.ndarray:
    return simulate(load_sim_graph(graph), iterations=2).peak_bytes


def test_a_ddp_graph_at_another_dp_is_the_one_a_capture_there_gives(ddp) -> None:
    built, direct = ddp
    assert read_metadata(built).layout == read_metadata(direct).layout
    for rank in (0, 5, 7):
        assert _nodes(built, rank) == _nodes(direct, rank)
        assert {size for *_, kind, size in _nodes(built, rank) if kind == "dp"} == {8}
        # Each bucket's all-reduce priced over the 8 ranks, as the capture at 8's.
        assert (_collective_prices(built, rank) == _collective_prices(direct, rank)).all()
    static = [read_metadata(g).extra[gf.STATIC_BYTES_KEY] for g in (built, direct)]
    assert static[0] == static[1]
    assert (_peaks(built) == _peaks(direct)).all()
    assert read_metadata(built).build_options[gf.CAPTURED_LAYOUT_KEY]["dp"] == 2


def test_the_built_rank_replays_with_the_program(ddp, tmp_path: Path) -> None:
    built, _ = ddp
    report = replayed(built, 5, DDP, out=tmp_path / "replay")
    assert report.predicted_peak_bytes > 0
    refused = runner.invoke(replay_app, [str(built), "--rank", "5", "-o", str(tmp_path / "r")])
    assert refused.exit_code != 0 and "give your program at tp=1 pp=1 dp=8" in refused.output


def test_hsdp_at_more_replicas_is_the_capture_there_but_its_mesh_table(hsdp_graphs) -> None:
    _, built, direct = hsdp_graphs
    for rank in (0, 3, 15):
        assert _nodes(built, rank) == _nodes(direct, rank)
        assert (_collective_prices(built, rank) == _collective_prices(direct, rank)).all()
    # The program holds its device mesh's rank table (8 bytes a replica on this torch) as captured.
    short = (
        np.array(read_metadata(direct).extra[gf.STATIC_BYTES_KEY])
        - read_metadata(built).extra[gf.STATIC_BYTES_KEY]
    )
    assert ((0 <= short) & (short <= 8 * 8)).all()
    assert (_peaks(direct) - _peaks(built) == short[0]).all()


def test_a_sharded_data_parallel_axis_is_refused_in_one_line(hsdp_graphs, tmp_path: Path) -> None:
    capture = hsdp_graphs[0]
    result = runner.invoke(build_app, [str(capture), "--dp", "8", "-o", str(tmp_path / "g.parquet")])
    assert result.exit_code == 2
    assert "group 'dp_shard." in result.output and "capture at the target layout" in result.output
    assert not (tmp_path / "g.parquet").exists()
