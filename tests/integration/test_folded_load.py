"""Identical dp replicas read once from the file (``prism.graph.sim.folded``) predict exactly what
the whole graph, loaded and folded in memory, predicts: plain, under what-ifs that change one
rank alone, and re-costed on another cluster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.build.cli import app as build_app
from prism.graph.io.parquet import GraphFormatError, GraphReader, GraphWriter, read_metadata, read_rank
from prism.graph.sim.cli import app as simulate_app
from prism.graph.sim.folded import load_folded, recorded_replicas
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.predict import predict
from prism.graph.sim.whatif import BlockDelay, SlowRank, WhatIf
from prism.replay.cli import app as replay_app
from prism.replay.cosim import open_cosimulation
from prism.schemas import graph_format as gf
from prism.schemas.cluster import preset
from prism.schemas.summary import read_summary


@pytest.fixture(scope="module")
def wide_graph(fuzz_capture: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fuzz capture (tp=1 pp=2) built for dp=8, on 4 'GPUs' a node: replicas 0-1 and 2-3 sit
    on their nodes alike, so they fold, and pipeline transfers cross nodes."""
    out = tmp_path_factory.mktemp("folded") / "graph.parquet"
    cluster = replace(preset("h100-ib"), gpus_per_node=4)
    build_graph(BuildOptions(capture_dir=fuzz_capture, out=out, tp=1, pp=2, dp=8, cluster=cluster))
    return out


def test_the_build_records_which_replicas_repeat_which(wide_graph: Path) -> None:
    replica_of = recorded_replicas(wide_graph)
    assert replica_of is not None and len(replica_of) == 8
    assert (replica_of[replica_of] == replica_of).all()
    folding = load_folded(wide_graph)
    assert folding.folded and folding.graph.ranks < 16
    assert folding.graph.ranks == 2 * len(np.unique(replica_of))  # each representative's two stages


@pytest.mark.parametrize(
    "what_if",
    [
        WhatIf(),
        WhatIf(slow_ranks=(SlowRank(rank=5, factor=1.5),)),
        WhatIf(slow_ranks=(SlowRank(rank=8, factor=1.5),)),  # in replica 0, which others repeat
        WhatIf(delays=(BlockDelay(phase="bwd", layer=None, delay_ns=200_000, rank=3),)),
        WhatIf(delays=(BlockDelay(phase="fwd", layer=None, delay_ns=100_000),)),
        WhatIf(cluster=replace(preset("h100-ib"), gpus_per_node=3)),
    ],
    ids=["plain", "slow-rank", "slow-representative", "rank-delay", "delay-everywhere", "other-cluster"],
)
def test_folded_from_the_file_predicts_what_the_whole_graph_predicts(
    wide_graph: Path, what_if: WhatIf
) -> None:
    whole = predict(wide_graph, what_if, graph=load_sim_graph(wide_graph))
    folded = predict(wide_graph, what_if)
    assert folded.ranks == whole.ranks
    assert folded.ranks["iteration_ns"] != [] and len(folded.ranks["rank"]) == 16


def _without_record(graph: Path, out: Path) -> Path:
    metadata = read_metadata(graph)
    bare = replace(metadata, extra={k: v for k, v in metadata.extra.items() if k != gf.REPLICA_OF_KEY})
    with GraphWriter(out, bare) as writer:
        writer.write_ranks(pq.read_table(graph, schema=gf.SCHEMA))
    return out


def test_a_graph_without_the_record_is_folded_in_memory(wide_graph: Path, tmp_path: Path) -> None:
    out = _without_record(wide_graph, tmp_path / "bare.parquet")
    assert recorded_replicas(out) is None
    assert predict(out).ranks == predict(wide_graph).ranks


def test_a_replay_reads_the_distinct_replicas_and_the_real_ranks_own(
    wide_graph: Path, tmp_path: Path
) -> None:
    """The co-simulation of real ranks 5 and 14 (replicas 5 and 6) holds the representatives and
    those two replicas, and predicts for them what the whole graph folded in memory predicts."""
    cosim, predictions = open_cosimulation(wide_graph, (5, 14))
    assert cosim.folding.graph.ranks == 2 * (len(np.unique(recorded_replicas(wide_graph))) + 2)
    _, whole = open_cosimulation(_without_record(wide_graph, tmp_path / "bare.parquet"), (5, 14))
    assert predictions == whole


def test_a_record_that_does_not_describe_the_replicas_is_refused(wide_graph: Path, tmp_path: Path) -> None:
    metadata = read_metadata(wide_graph)
    bad = replace(metadata, extra={**metadata.extra, gf.REPLICA_OF_KEY: [1, 0, 0, 0, 0, 0, 0, 0]})
    out = tmp_path / "bad.parquet"
    with GraphWriter(out, bad) as writer:
        writer.write_ranks(pq.read_table(wide_graph, schema=gf.SCHEMA))
    with pytest.raises(GraphFormatError, match="replica_of"):
        load_folded(out)


@pytest.mark.slow
def test_a_job_of_32768_ranks_is_built_simulated_and_replayed_here(
    fuzz_capture: Path, tmp_path: Path
) -> None:
    """tp=1 pp=2 dp=16384: built row group by row group into two part files and validated as
    written, its summary and a what-if simulated from the distinct replicas, its last rank
    replayed against them."""
    graph, world = tmp_path / "graph.parquet", 32_768
    built = CliRunner().invoke(
        build_app, [str(fuzz_capture), "--tp", "1", "--pp", "2", "--dp", "16384", "-o", str(graph)]
    )
    assert built.exit_code == 0, built.output
    with GraphReader(graph) as reader:  # two part files of 512 row groups of 32 ranks: small footers
        assert (reader.num_parts, reader.num_row_groups) == (2, 1024)
    summary = read_summary(tmp_path / "summary.json")
    iteration = np.asarray(summary.ranks["iteration_ns"])
    assert len(iteration) == world and (iteration > 0).all()
    stage = np.asarray(summary.ranks["stage"])
    assert all(len(np.unique(iteration[stage == s])) == 1 for s in (0, 1))  # identical replicas alike
    assert len(read_rank(graph, world - 1)) == len(
        read_rank(graph, world // 2)
    )  # both stage 1, first and last replica

    slowed = CliRunner().invoke(
        simulate_app, [str(graph), "--slow-rank", "30001:x3", "-o", str(tmp_path / "s.json")]
    )
    assert slowed.exit_code == 0, slowed.output
    after = np.asarray(read_summary(tmp_path / "s.json").ranks["iteration_ns"])
    assert after.max() > iteration.max()  # the slow rank holds its dp peers back at the gradient sync

    out = tmp_path / "replay"
    replayed = CliRunner().invoke(
        replay_app,
        [str(graph), "--rank", str(world - 1), "-o", str(out), "--warmup", "4", "--iterations", "1"],
    )
    assert replayed.exit_code == 0, replayed.output
    assert (out / "report.json").exists()
