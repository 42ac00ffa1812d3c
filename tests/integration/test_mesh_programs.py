"""Programs on an N-dimensional mesh through every stage: HSDP (``fully_shard`` on a 2-D mesh), a
mixture of experts with expert parallelism (all-to-all dispatch and combine) and context parallel
attention (keys and values all-gathered over a sequence's ranks), each captured at 8,192 target
ranks, built, validated, simulated and one rank replayed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.graph.build.cli import app as build_app
from prism.graph.io.reader import read_metadata
from prism.graph.sim.cli import app as simulate_app
from prism.graph.sim.folded import load_folded
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.predict import predict
from prism.graph.sim.simulate import simulate
from prism.schemas import graph_format as gf
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import read_manifest
from tests.integration.programs import captured_and_built, replayed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ("--steps", "50", "--hidden", "32", "--vocab", "64", "--seq", "8", "--batch", "4", "--layers", "2")
HSDP = ("--dp-replicate", "8", "--dp-shard", "1024")
runner = CliRunner()

pytestmark = pytest.mark.slow


def calls_of(graph: Path) -> pd.DataFrame:
    """The collective nodes of ``graph``."""
    columns = [gf.RANK, gf.NAME, gf.GROUP_KIND, gf.GROUP_INDEX, gf.GROUP_SIZE, gf.COLL_ID]
    nodes = pq.read_table(graph, columns=columns).to_pandas()
    return nodes[nodes[gf.COLL_ID] >= 0]


def groups_of(calls: pd.DataFrame, rank: int) -> dict[str, int]:
    """The index of ``rank``'s group of each kind it calls on."""
    mine = (
        calls[calls[gf.RANK] == rank].drop_duplicates(gf.GROUP_KIND).set_index(gf.GROUP_KIND)[gf.GROUP_INDEX]
    )
    return {str(k): int(v) for k, v in mine.items()}


HSDP_PROGRAM = (str(EXAMPLES / "fsdp2.py"), "--replicate", "8", *TINY)


@pytest.fixture(scope="module")
def hsdp_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return captured_and_built(tmp_path_factory.mktemp("hsdp") / "cap", HSDP, HSDP_PROGRAM)[1]


def test_hsdp_at_8192_ranks_binds_its_shard_and_replica_groups(hsdp_graph: Path) -> None:
    layout = ParallelLayout.from_dict(read_metadata(hsdp_graph).layout)
    assert (layout.world_size, layout.dp_replicate, layout.dp_shard) == (8192, 8, 1024)
    calls = calls_of(hsdp_graph)
    sizes = calls.groupby(calls[gf.GROUP_KIND].astype(str))[gf.GROUP_SIZE].unique().to_dict()
    assert {k: list(v) for k, v in sizes.items()} == {"dp_shard": [1024], "dp_replicate": [8]}
    # Rank 1027 is shard 3 of replica 1: its shard group is replica 1's, its replica group shard 3's.
    assert groups_of(calls, 1027) == {"dp_shard": 1, "dp_replicate": 3}
    # Every instance holds its whole group: 8 ranks a shard apart, or a replica's 1,024 in a row.
    members = calls.groupby(gf.COLL_ID)[gf.RANK].agg(["count", "min", "max"])
    assert set(members["count"]) == {8, 1024}
    spread = (members["max"] - members["min"]).to_numpy()
    assert set(spread[members["count"].to_numpy() == 8]) == {7 * 1024}
    assert set(spread[members["count"].to_numpy() == 1024]) == {1023}


def test_hsdp_replicas_are_simulated_once_and_predict_what_the_whole_graph_does(hsdp_graph: Path) -> None:
    assert load_folded(hsdp_graph).graph.ranks == 1024  # the eight replicas sit alike
    whole = simulate(load_sim_graph(hsdp_graph), iterations=2)
    assert predict(hsdp_graph).ranks["iteration_ns"] == whole.iteration_ns.tolist()


def test_an_hsdp_rank_replays_with_its_memory(hsdp_graph: Path, tmp_path: Path) -> None:
    assert abs(replayed(hsdp_graph, 1027, HSDP_PROGRAM, out=tmp_path / "replay").mem_err_pct) < 0.1


def test_an_axis_the_program_never_calls_across_stops_the_capture(tmp_path: Path) -> None:
    result = runner.invoke(
        capture_app,
        ["--pp", "2", "--dp", "4", "--warmup", "3", "--iterations", "2", "-o", str(tmp_path / "cap"), "--",
         str(EXAMPLES / "fsdp2.py"), *TINY],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "the layout has pp=2 but the program made no transfer between pipeline stages" in result.output
    assert not (tmp_path / "cap").exists()


MOE = ("--dp", "8192", "--ep", "8")
MOE_PROGRAM = (str(EXAMPLES / "moe.py"), "--ep", "8", "--steps", "50", "--hidden", "32", "--vocab", "64")


@pytest.fixture(scope="module")
def moe_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return captured_and_built(tmp_path_factory.mktemp("moe") / "cap", MOE, MOE_PROGRAM)[1]


def test_expert_parallel_all_to_alls_bind_to_their_ep_groups_at_8192_ranks(moe_graph: Path) -> None:
    calls = calls_of(moe_graph)
    by_kind = calls.groupby(calls[gf.GROUP_KIND].astype(str)).agg(
        names=(gf.NAME, lambda n: sorted(set(map(str, n)))), size=(gf.GROUP_SIZE, "max")
    )
    # Dispatch and combine on each ep group of 8; the dense gradients over all 8,192 ranks; the
    # experts' over the 1,024 ranks that hold the same ones.
    assert by_kind["size"].to_dict() == {"dp": 8192, "edp": 1024, "ep": 8}
    assert by_kind.loc["ep", "names"] == ["all_to_all"]
    assert groups_of(calls, 4099) == {"ep": 512, "edp": 3, "dp": 0}


def test_expert_blocks_are_simulated_once_and_predict_what_the_whole_graph_does(moe_graph: Path) -> None:
    # dp 8,192 with ep 8: 1,024 blocks of 8 consecutive ranks (one ep group each), each on a node.
    assert load_folded(moe_graph).graph.ranks == 8
    whole = simulate(load_sim_graph(moe_graph), iterations=2)
    assert predict(moe_graph).ranks["iteration_ns"] == whole.iteration_ns.tolist()


def test_each_all_to_all_carries_what_its_rank_sends_each_member(moe_graph: Path) -> None:
    columns = [gf.RANK, gf.NAME, gf.COLL_ID, gf.BYTES, gf.SPLIT_BYTES, gf.DUR_NS]
    nodes = pq.read_table(moe_graph, columns=columns, filters=[(gf.NAME, "=", "all_to_all")]).to_pandas()
    splits = {rank: np.stack(rows[gf.SPLIT_BYTES].to_numpy()) for rank, rows in nodes.groupby(gf.RANK)}
    assert all(s.shape[1] == 8 for s in splits.values())
    assert (np.stack(nodes[gf.SPLIT_BYTES].to_numpy()).sum(axis=1) == nodes[gf.BYTES]).all()
    # Each member routes as the captured rank did, from its own place: the next member's splits
    # are this one's, one place on.
    assert np.array_equal(np.roll(splits[4098], 1, axis=1), splits[4099])
    # And all members of one call are priced alike: it ends when its busiest member is done.
    assert (nodes.groupby(gf.COLL_ID)[gf.DUR_NS].nunique() == 1).all()


def test_a_routing_skew_slows_the_job_by_its_busiest_experts(moe_graph: Path, tmp_path: Path) -> None:
    iteration_ms = []
    for skew in ("0.5", "1"):
        out = tmp_path / f"skew{skew}.json"
        result = runner.invoke(simulate_app, [str(moe_graph), "--moe-skew", skew, "-o", str(out)])
        assert result.exit_code == 0, result.output
        summary = json.loads(out.read_text())
        assert summary["what_if"]["moe_skew"] == float(skew)
        iteration_ms.append(max(summary["ranks"]["iteration_ns"]) / 1e6)
    built = max(predict(moe_graph).ranks["iteration_ns"]) / 1e6
    assert built < iteration_ms[0] < iteration_ms[1], (built, iteration_ms)


def test_an_expert_parallel_rank_replays_with_its_memory(moe_graph: Path, tmp_path: Path) -> None:
    assert abs(replayed(moe_graph, 4099, MOE_PROGRAM, out=tmp_path / "replay").mem_err_pct) < 0.1


CP = ("--dp", "2048", "--cp", "4")
CP_PROGRAM = (str(EXAMPLES / "cp.py"), "--cp", "4", "--steps", "50", "--hidden", "32", "--vocab", "64",
              "--seq", "32")  # fmt: skip


def test_context_parallel_at_8192_ranks_gathers_on_its_cp_groups_and_replays(tmp_path: Path) -> None:
    _, graph = captured_and_built(tmp_path / "cap", CP, CP_PROGRAM)
    calls = calls_of(graph)
    mine = calls[calls[gf.RANK] == 4097]
    kinds = mine.groupby([mine[gf.GROUP_KIND].astype(str), mine[gf.NAME].astype(str)])[gf.GROUP_SIZE].max()
    # Keys and values gathered across the 4 ranks of a sequence, their gradients reduce-scattered
    # back; the weights' gradients averaged over all 8,192.
    expected = {("cp", "all_gather"): 4, ("cp", "reduce_scatter"): 4, ("world", "all_reduce"): 8192}
    assert kinds.to_dict() == expected
    assert abs(replayed(graph, 4097, CP_PROGRAM, out=tmp_path / "replay").mem_err_pct) < 0.1


PROGRAMS = Path(__file__).resolve().parents[1] / "data" / "programs"


def test_a_context_parallel_rank_that_calls_differently_runs_its_own_program(tmp_path: Path) -> None:
    # The first slice's ranks log the loss over their dp group; the others never call it. Captured
    # with the last rank of every axis, the ranks past the first on cp run the cp end's calls.
    capture, graph = tmp_path / "cap", tmp_path / "cap.parquet"
    program = (str(PROGRAMS / "cp_logged_loss.py"), "--cp", "4", "--steps", "50")
    result = runner.invoke(
        capture_app,
        ["--dp", "2048", "--cp", "4", "--roles", "axis-ends", "--warmup", "4", "--iterations", "2",
         "-o", str(capture), "--", *program],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # The first; cp 1 and its end; dp 1 and its end.
    assert sorted(r.rank for r in read_manifest(capture).ranks) == [0, 1, 3, 4, 8188]
    result = runner.invoke(build_app, [str(capture), "-o", str(graph)])
    assert result.exit_code == 0, result.output
    assert "the ranks of pipeline stage 0 at cp 1..3 run captured rank 3's calls" in " ".join(
        result.output.split()
    )
    calls = calls_of(graph)
    logged = calls[calls[gf.GROUP_KIND].astype(str) == "dp"]
    # Every first-slice rank (cp 0) logs over its 2,048 replicas; no other rank does.
    assert set(logged[gf.RANK] % 4) == {0} and logged[gf.RANK].nunique() == 2048
    assert set(logged[gf.GROUP_SIZE]) == {2048}
    metadata = read_metadata(graph)
    assert [v["axis"] for v in metadata.extra[gf.RANK_VARIANTS_KEY]] == ["cp"]
    assert load_folded(graph).graph.ranks == 4  # the dp replicas still sit alike: one is simulated
    # A replayed cp-1 rank makes its own calls against the graph, its memory as the graph has it.
    assert abs(replayed(graph, 4097, program, out=tmp_path / "replay").mem_err_pct) < 0.1


def test_axis_ends_of_an_expert_parallel_program_that_routes_alike_build(tmp_path: Path) -> None:
    layout = ("--dp", "8", "--ep", "4", "--roles", "axis-ends")
    program = (str(EXAMPLES / "moe.py"), "--ep", "4", "--steps", "50", "--hidden", "32", "--vocab", "64")
    capture, _ = captured_and_built(tmp_path / "cap", layout, program)  # built and valid
    # dp's, expert dp's and ep's second ranks and ends, each routing its own tokens: rank 0's calls.
    assert sorted(r.rank for r in read_manifest(capture).ranks) == [0, 1, 3, 4, 7]
