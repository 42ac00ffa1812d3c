"""torchtitan, unmodified, through every prism stage on this CPU box, under
``prism-capture ... -- -m torchtitan.train ...``: its llama3 debug model in four dimensions
(interleaved pipelining, HSDP's replicas and shards, tensor parallel with sequence parallel) and
its DeepSeek-V3 debug model (a mixture of experts) with HSDP, context parallel and expert parallel,
each captured at 8,192 ranks, built, validated, simulated and replayed, one rank per role; llama3
pipelined by the zero-bubble V schedule at 1,024 ranks; and its training steps, cut by a container
optimizer's outermost step, give the graph its own profiler's steps give. Skipped where
torchtitan is not installed (a test extra, with torch >= 2.14, whose APIs torchtitan 0.3.0 calls)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from prism.graph.build.cli import app as build_app
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.predict import predict
from prism.graph.sim.simulate import simulate
from prism.schemas import graph_format as gf
from prism.schemas.manifest import read_manifest
from tests.integration.programs import captured_and_built, replayed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torchtitan") is None
        or torch.torch_version.TorchVersion(torch.__version__) < (2, 14),
        reason="needs torchtitan (a test extra) and torch >= 2.14",
    ),
]
ASSETS = Path(__file__).resolve().parents[1] / "data" / "torchtitan" / "make_assets.py"


def debug_model(module: str, config: str, seq_len: int = 128) -> tuple[str, ...]:
    return (
        "-m", "torchtitan.train", "--module", module, "--config", config,
        "--training.seq_len", str(seq_len), "--training.local_batch_size", "2", "--training.steps", "100",
        "--metrics.log_freq", "1000", "--training.disable_cuda_graphs",
    )  # fmt: skip


LLAMA3 = debug_model("llama3", "llama3_debugmodel")
# Context parallel cuts the sequence into 2 x cp blocks of FlexAttention's 128 tokens.
DEEPSEEK_V3 = debug_model("deepseek_v3", "deepseek_v3_debugmodel", seq_len=256)  # 8 experts, 5 MoE layers
TORCHTITAN_DEGREE = {  # prism's layout option: torchtitan's
    "--tp": "tensor_parallel_degree", "--pp": "pipeline_parallel_degree",
    "--dp-replicate": "data_parallel_replicate_degree", "--dp-shard": "data_parallel_shard_degree",
    "--cp": "context_parallel_degree", "--ep": "expert_parallel_degree",
}  # fmt: skip


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


def torchtitan_captured_and_built(
    workdir: Path, name: str, model: tuple[str, ...], degrees: dict[str, int], *extra: str
) -> tuple[Path, Path]:
    """``model`` captured at the layout ``degrees`` gives prism and torchtitan alike, then built."""
    layout = tuple(arg for option, n in degrees.items() for arg in (option, str(n)))
    parallelism = tuple(
        arg for option, n in degrees.items() for arg in (f"--parallelism.{TORCHTITAN_DEGREE[option]}", str(n))
    )
    return captured_and_built(workdir / name, layout, (*model, *parallelism, *extra))


@pytest.fixture(scope="module")
def four_d(workdir: Path) -> tuple[Path, Path]:
    """pp=2 (Interleaved1F1B: two stages a rank, four in all) x HSDP 8 replicas x 256 shards x tp=2
    (sequence parallel): 8,192 ranks."""
    degrees = {"--pp": 2, "--dp-replicate": 8, "--dp-shard": 256, "--tp": 2}
    schedule = ("--parallelism.pipeline_parallel_schedule", "Interleaved1F1B")
    return torchtitan_captured_and_built(workdir, "pp2_hsdp8x256_tp2", LLAMA3, degrees, *schedule)


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
    report = replayed(graph, rank)
    assert report.measured_iter_ms > 0 and abs(report.mem_err_pct) < 1.0


def test_torchtitan_zero_bubble_v_schedule_at_1024_ranks_is_built_and_simulated(workdir: Path) -> None:
    """ZBVZeroBubble: each rank holds two stages in a V (rank 0 the first and the last), and its
    backward is split into the inputs' and the weights' gradients (which torchtitan's selective
    activation checkpointing, run backward twice, refuses: without it, as torchtitan says)."""
    degrees = {"--pp": 2, "--dp-shard": 512}
    schedule = ("--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble", "activation_checkpoint:none")
    capture, graph = torchtitan_captured_and_built(workdir, "pp2_fsdp512_zbv", LLAMA3, degrees, *schedule)
    for rank in read_manifest(capture).ranks:
        steady = rank.result.calls[rank.result.steady_from :]
        assert len(set(steady)) == 1, rank.result.calls  # one iteration a training step
    nodes = pq.read_table(graph, columns=[gf.RANK, gf.KIND, gf.PEER]).to_pandas()
    for rank, peer in ((0, 512), (700, 188)):  # each stage pair's transfers go both ways, between them only
        mine = nodes[nodes[gf.RANK] == rank]
        for kind in (gf.NodeKind.SEND, gf.NodeKind.RECV):
            assert set(mine[mine[gf.KIND] == kind.value][gf.PEER]) == {peer}
    iteration_ns = predict(graph).ranks["iteration_ns"]
    assert len(iteration_ns) == 1024 and min(iteration_ns) > 0


def test_steps_cut_at_the_container_optimizer_give_the_graph_its_profiler_steps_give(workdir: Path) -> None:
    """torchtitan's OptimizersContainer steps an inner optimizer inside its own step: one training
    step, one iteration, the same graph as when its own profiler's steps cut the program."""
    iterations, predicted = [], []
    for name, extra in (
        ("steps", ()),
        ("profiler", ("--profiler.enable_profiling", "--profiler.profile_freq", "5")),
    ):
        capture, graph = torchtitan_captured_and_built(
            workdir, f"fsdp_{name}", LLAMA3, {"--dp-shard": 64}, *extra
        )
        (rank,) = read_manifest(capture).ranks
        iterations.append(rank.result.calls[rank.result.steady_from :])
        predicted.append(float(simulate(load_sim_graph(graph), iterations=2).iteration_ns.mean()))
    assert iterations[0] == iterations[1] and len(set(iterations[0])) == 1  # the same calls, each step


def test_torchtitan_captured_with_its_six_layers_is_built_at_sixteen(workdir: Path) -> None:
    """prism-build-graph --layers: the debug model's six layers, FSDP-sharded over 64 ranks, walked
    sixteen times; its memory and time grow by the layers' part."""
    capture, graph = torchtitan_captured_and_built(workdir, "fsdp_layers", LLAMA3, {"--dp-shard": 64})
    built = workdir / "fsdp_layers16.parquet"
    result = CliRunner().invoke(build_app, [str(capture), "--layers", "16", "-o", str(built)])
    assert result.exit_code == 0, result.output
    assert validate_graph(built).ok
    six, sixteen = (simulate(load_sim_graph(g), iterations=2) for g in (graph, built))
    assert (sixteen.peak_bytes > six.peak_bytes).all()
    growth = float(sixteen.iteration_ns.mean() / six.iteration_ns.mean())
    # The layers most of an iteration; the repeated layer takes one captured layer's time, a few
    # percent over or under the captured layers' mean (2.4-2.55 measured against 16 / 6).
    assert 16 / 6 * 0.7 < growth < 16 / 6 * 1.1, growth
    layers = pq.read_table(built, columns=[gf.LAYER]).column(0).to_numpy()
    assert set(layers) == {-1, *range(16)}


@pytest.fixture(scope="module")
def moe(workdir: Path) -> tuple[Path, Path]:
    """DeepSeek-V3's debug model (mixture of experts) at 8,192 ranks: HSDP 512 replicas x 8 shards,
    context parallel 2, and expert parallel 8 over the 16 ranks of dp_shard x cp (expert data
    parallel 2), as torchtitan builds its sparse mesh."""
    degrees = {"--dp-replicate": 512, "--dp-shard": 8, "--cp": 2, "--ep": 8}
    return torchtitan_captured_and_built(workdir, "moe_hsdp512x8_cp2_ep8", DEEPSEEK_V3, degrees)


def test_torchtitan_moe_with_context_and_expert_parallel_at_8192_ranks_is_built_on_its_mesh(moe) -> None:
    capture, graph = moe
    layout = read_manifest(capture).layout
    assert (layout.world_size, layout.cp, layout.ep, layout.edp) == (8192, 2, 8, 2)
    calls = pq.read_table(
        graph, columns=[gf.RANK, gf.KIND, gf.NAME, gf.GROUP_KIND, gf.GROUP_SIZE]
    ).to_pandas()
    calls = calls[(calls[gf.RANK] == 0) & (calls[gf.KIND] == gf.NodeKind.COLLECTIVE.value)]
    # Each of torchtitan's groups bound to its kind: FSDP over dp_shard x cp, the experts' FSDP over
    # expert data parallel, HSDP's replicas, context parallel's key-value gathers; the tokens'
    # dispatch and combine are all-to-alls over the expert-parallel groups of 8, and nothing else.
    kinds = set(calls[gf.GROUP_KIND])
    assert {"dp_shard_cp", "edp", "dp_replicate", "cp", "ep"} <= kinds, kinds
    to_all = calls[calls[gf.NAME] == "all_to_all"]
    assert len(to_all) > 0 and set(to_all[gf.GROUP_KIND]) == {"ep"} and set(to_all[gf.GROUP_SIZE]) == {8}
    iteration_ns = predict(graph).ranks["iteration_ns"]  # the 512 replicas alike, simulated once
    assert len(iteration_ns) == 8192 and min(iteration_ns) > 0


def test_torchtitan_moe_replays_with_its_memory(moe) -> None:
    _, graph = moe
    report = replayed(graph, 0)
    assert report.measured_iter_ms > 0 and abs(report.mem_err_pct) < 1.0
