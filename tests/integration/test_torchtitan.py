"""torchtitan, unmodified, through every prism stage on this CPU box: its llama3 debug model under
``prism-capture ... -- -m torchtitan.train ...`` in four dimensions (pipelining, HSDP's replicas
and shards, tensor parallel with sequence parallel), captured at 8,192 ranks, built, validated,
simulated and replayed, one rank per role; and its training steps, cut by a container optimizer's
outermost step, give the graph its own profiler's steps give. Skipped where torchtitan is not
installed (a test extra, with torch >= 2.14, whose APIs torchtitan 0.3.0 calls)."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.graph.build.cli import app as build_app
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.predict import predict
from prism.graph.sim.simulate import simulate
from prism.replay.cli import app as replay_app
from prism.schemas import graph_format as gf
from prism.schemas.manifest import read_manifest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None
        or torch.torch_version.TorchVersion(torch.__version__) < (2, 14),
        reason="needs torchtitan (a test extra) and torch >= 2.14",
    ),
]
ASSETS = Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "make_assets.py"
runner = CliRunner()

DEBUG_MODEL = (
    "-m", "torchtitan.train", "--module", "llama3", "--config", "llama3_debugmodel",
    "--training.seq_len", "128", "--training.local_batch_size", "2", "--training.steps", "100",
    "--metrics.log_freq", "1000", "--training.disable_cuda_graphs",
)  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder the tests run in, holding the tokenizer and data torchtitan's debug
    configuration reads from ``./tests/assets``."""
    spec = importlib.util.spec_from_file_location("make_assets", ASSETS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = module.write_assets(tmp_path_factory.mktemp("torchtitan"))
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(before)


def layout_options(tp: int, pp: int, dp: int, replicas: int = 1) -> tuple[str, ...]:
    return ("--tp", str(tp), "--pp", str(pp), "--dp-replicate", str(replicas), "--dp-shard", str(dp))


def torchtitan_options(tp: int, pp: int, dp: int, replicas: int, *extra: str) -> tuple[str, ...]:
    return (
        *DEBUG_MODEL,
        "--parallelism.tensor_parallel_degree", str(tp), "--parallelism.pipeline_parallel_degree", str(pp),
        "--parallelism.data_parallel_replicate_degree", str(replicas),
        "--parallelism.data_parallel_shard_degree", str(dp), *extra,
    )  # fmt: skip


def captured_and_built(
    workdir: Path, name: str, tp: int, pp: int, dp: int, *extra: str, replicas: int = 1
) -> tuple[Path, Path]:
    out, graph = workdir / name, workdir / f"{name}.parquet"
    options = (*layout_options(tp, pp, dp, replicas), "--warmup", "4", "--iterations", "2", "-o", str(out))
    result = runner.invoke(capture_app, [*options, "--", *torchtitan_options(tp, pp, dp, replicas, *extra)])
    assert result.exit_code == 0, result.output
    built = runner.invoke(build_app, [str(out), "-o", str(graph)])  # at the capture's layout
    assert built.exit_code == 0, built.output
    assert validate_graph(graph).ok
    return out, graph


@pytest.fixture(scope="module")
def four_d(workdir: Path) -> tuple[Path, Path]:
    """pp=2 (1F1B) x HSDP 8 replicas x 256 shards x tp=2 (sequence parallel): 8,192 ranks."""
    return captured_and_built(
        workdir,
        "pp2_hsdp8x256_tp2",
        2,
        2,
        256,
        "--parallelism.pipeline_parallel_schedule",
        "1F1B",
        replicas=8,
    )


def test_torchtitan_in_four_dimensions_at_8192_ranks_is_captured_built_and_simulated(four_d) -> None:
    capture, graph = four_d
    manifest = read_manifest(capture)
    assert manifest.layout.world_size == 8192 and manifest.layout.dp_replicate == 8
    assert sorted(r.role.value for r in manifest.ranks) == ["first", "last"]
    for rank in manifest.ranks:
        # One iteration a training step: the steady iterations make the same calls.
        steady = rank.result.calls[rank.result.steady_from :]
        assert len(set(steady)) == 1 and steady[0] > 50, rank.result.calls
    kinds = set(pq.read_table(graph, columns=[gf.GROUP_KIND]).column(0).to_pylist())
    assert {"tp", "pp", "dp_shard", "dp_replicate"} <= kinds  # every dimension's groups, bound
    iteration_ns = predict(graph).ranks["iteration_ns"]  # the 8 replicas alike, simulated once
    assert len(iteration_ns) == 8192 and min(iteration_ns) > 0


@pytest.mark.parametrize("rank", [0, 4096], ids=["first-stage", "last-stage"])
def test_torchtitan_in_four_dimensions_replays_each_role_with_its_memory(four_d, rank: int) -> None:
    _, graph = four_d
    out = graph.parent / f"replay{rank}"
    result = runner.invoke(
        replay_app, [str(graph), "--rank", str(rank), "--warmup", "5", "--iterations", "2", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    (report,) = json.loads((out / "report.json").read_text())["ranks"]
    assert report["measured_iter_ms"] > 0 and abs(report["mem_err_pct"]) < 1.0


def test_steps_cut_at_the_container_optimizer_give_the_graph_its_profiler_steps_give(workdir: Path) -> None:
    """torchtitan's OptimizersContainer steps an inner optimizer inside its own step: one training
    step, one iteration, the same graph as when its own profiler's steps cut the program."""
    iterations, predicted = [], []
    for name, extra in (
        ("steps", ()),
        ("profiler", ("--profiler.enable_profiling", "--profiler.profile_freq", "5")),
    ):
        capture, graph = captured_and_built(workdir, f"fsdp_{name}", 1, 1, 64, *extra)
        (rank,) = read_manifest(capture).ranks
        iterations.append(rank.result.calls[rank.result.steady_from :])
        predicted.append(float(simulate(load_sim_graph(graph), iterations=2).iteration_ns.mean()))
    assert iterations[0] == iterations[1] and len(set(iterations[0])) == 1  # the same calls, each step
    # Within this machine's noise (cut at the inner step, the graph was 40 times too fast).
    assert 0.67 < predicted[0] / predicted[1] < 1.5, predicted
