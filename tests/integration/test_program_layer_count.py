"""A program built at another layer count than the one captured: the graph a capture at that
count gives, to the byte in memory, and replayed with the program at that count."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from prism.graph.build.cli import app as build_app
from prism.graph.io.parquet import read_metadata
from prism.graph.io.validate import validate_graph
from prism.graph.sim.load import graph_column, load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.replay.cli import app as replay_app
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import WAIT_NAME, NodeKind
from tests.integration.programs import captured_and_built, replayed

REDUCER_SCALE = "torch::distributed::reducer::mul_out"
"""DDP's copy of a gradient into its bucket: a unit of its own only beside a bucket call."""
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
runner = CliRunner()


def fsdp2(layers: int) -> tuple[str, ...]:
    return (str(EXAMPLES / "fsdp2.py"), "--steps", "50", "--hidden", "32", "--layers", str(layers), "--vocab", "64",
            "--batch", "2", "--seq", "8")  # fmt: skip


def built_at(
    root: Path,
    layout: tuple[str, ...],
    program: Callable[[int], tuple[str, ...]],
    captured: int,
    target: int,
    *,
    warmup: int = 4,
) -> tuple[Path, Path, Path, Path]:
    """``program`` at ``captured`` layers captured and built, the capture built at ``target`` layers,
    and ``program`` at ``target`` captured and built: (capture, its graph, built, direct graph)."""
    capture, graph = captured_and_built(root / f"at{captured}", layout, program(captured), warmup=warmup)
    _, direct = captured_and_built(root / f"at{target}", layout, program(target), warmup=warmup)
    built = root / f"at{captured}-built-at{target}.parquet"
    result = runner.invoke(build_app, [str(capture), "--layers", str(target), "-o", str(built)])
    assert result.exit_code == 0, result.output
    assert validate_graph(built).ok
    return capture, graph, built, direct


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A 5-layer capture's graph, the same capture built at 7 layers, a 7-layer capture's graph."""
    _, graph5, built7, graph7 = built_at(tmp_path_factory.mktemp("layer_count"), ("--dp", "4"), fsdp2, 5, 7)
    return graph5, built7, graph7


def _layer_units(graph: Path) -> list[tuple]:
    """Rank 0's forward and backward nodes: phase, layer, kind and payload, in program order."""
    ranks = np.array([0])
    columns = [graph_column(graph, c, ranks) for c in (gf.PHASE, gf.LAYER, gf.KIND, gf.BYTES)]
    keep = np.isin(columns[0], ("fwd", "bwd"))
    return [tuple(row) for row in zip(*(c[keep] for c in columns), strict=True)]


def test_the_built_layers_are_those_a_capture_at_that_count_runs(graphs) -> None:
    graph5, built7, graph7 = graphs
    assert _layer_units(built7) == _layer_units(graph7)
    assert _layer_units(built7) != _layer_units(graph5)
    layers = graph_column(built7, gf.LAYER, np.array([0]))
    assert set(np.unique(layers)) == {-1, *range(7)}
    assert read_metadata(built7).build_options["layers"] == 7


def test_memory_is_that_of_a_capture_at_that_count_to_the_byte(graphs) -> None:
    _, built7, graph7 = graphs
    static = [read_metadata(g).extra[gf.STATIC_BYTES_KEY] for g in (built7, graph7)]
    assert static[0] == static[1]
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (built7, graph7)]
    assert (peaks[0] == peaks[1]).all()
    five = simulate(load_sim_graph(graphs[0]), iterations=2).peak_bytes
    assert (peaks[0] > five).all()


def test_the_optimizer_step_steps_the_target_parameters(graphs) -> None:
    def step(graph: Path) -> np.ndarray:
        ranks = np.array([0])
        phase, kind, dur = (graph_column(graph, c, ranks) for c in (gf.PHASE, gf.KIND, gf.DUR_NS))
        return dur[(phase == "optim") & (kind == NodeKind.COMPUTE)]

    graph5, built7, graph7 = graphs
    # AdamW on CPU steps each parameter in turn: six a block, three outside the blocks, 45 at
    # 7 layers against 33 at 5, each with the captured ops of the parameter it copies.
    assert len(step(built7)) == len(step(graph7)) == len(step(graph5)) * 45 // 33
    # Each op is a captured one's, with its time; the copies add theirs (how much depends on how
    # long the profiled iterations' ops of the blocks took beside the others: not checked here).
    assert set(step(built7)) <= set(step(graph5)) and step(built7).sum() > step(graph5).sum()


def test_too_few_layers_for_the_captured_edges_are_refused(graphs, tmp_path: Path) -> None:
    graph5 = graphs[0]
    capture = graph5.with_suffix("")
    result = runner.invoke(build_app, [str(capture), "--layers", "2", "-o", str(tmp_path / "g.parquet")])
    assert result.exit_code != 0
    assert "--layers 2" in result.output and "at least" in result.output
    assert not (tmp_path / "g.parquet").exists()


def test_the_built_graph_replays_with_the_program_at_that_count(graphs, tmp_path: Path) -> None:
    built7 = graphs[1]
    report = replayed(built7, 0, fsdp2(7), out=tmp_path / "replay")
    assert report.predicted_peak_bytes > 0
    refused = runner.invoke(replay_app, [str(built7), "--rank", "0", "-o", str(tmp_path / "r")])
    assert refused.exit_code != 0 and "give your program at 7 layers" in refused.output


def pipelined(layers: int) -> tuple[str, ...]:
    """``examples/pp.py`` with ``layers`` in all, two stages of half of them."""
    return (str(EXAMPLES / "pp.py"), "--pp", "2", "--schedule", "1F1B", "--steps", "50", "--hidden", "32",
            "--vocab", "64", "--batch", "4", "--seq", "8", "--layers-per-stage", str(layers // 2))  # fmt: skip


@pytest.fixture(scope="module")
def pipelined_graphs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A pipeline of two 5-layer stages captured, built at 12 layers, and two 6-layer stages' graph."""
    layout = ("--tp", "1", "--pp", "2", "--dp", "1")
    capture, _, built, graph6 = built_at(
        tmp_path_factory.mktemp("pipelined_layers"), layout, pipelined, 10, 12, warmup=3
    )
    return capture, built, graph6


def _stage_units(graph: Path, rank: int) -> tuple[list[tuple], int]:
    """A rank's nodes but its waits (phase, layer, kind, payload), and how many waits: where a
    capture saw the program wait for a receive moves by a unit between two captures (a wait()
    beside a microsecond's op)."""
    ranks = np.array([rank])
    columns = [graph_column(graph, c, ranks) for c in (gf.PHASE, gf.LAYER, gf.KIND, gf.BYTES, gf.NAME)]
    waits = columns[-1] == WAIT_NAME
    return [tuple(row) for row in zip(*(c[~waits] for c in columns[:-1]), strict=True)], int(waits.sum())


@pytest.mark.slow
def test_each_pipeline_stage_walks_its_share_of_the_layers_as_captured_there(pipelined_graphs) -> None:
    _, built, graph6 = pipelined_graphs
    # Every unit of both stages, transfers and optimizer step included, in the schedule's order:
    # four microbatches' forward and backward passes over six layers a stage.
    for rank in (0, 1):
        assert _stage_units(built, rank) == _stage_units(graph6, rank)
    assert set(np.unique(graph_column(built, gf.LAYER, np.array([1])))) == {-1, *range(6)}
    static = [read_metadata(g).extra[gf.STATIC_BYTES_KEY] for g in (built, graph6)]
    assert static[0] == static[1]
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (built, graph6)]
    assert (peaks[0] == peaks[1]).all()
    # Each stage's iteration frees all it allocates, as the capture's does: the schedule's
    # per-microbatch state, dropped after the last gradient's scaling, is freed once, and each
    # optimizer group frees the temporaries of the parameter before it, not of its source's.
    for rank in (0, 1):
        ranks = np.array([rank])
        held = [
            int(graph_column(g, gf.ALLOC_BYTES, ranks).sum() - graph_column(g, gf.FREE_BYTES, ranks).sum())
            for g in (built, graph6)
        ]
        assert held == [0, 0]


@pytest.mark.slow
def test_a_layer_count_the_stages_cannot_share_equally_is_refused(pipelined_graphs, tmp_path: Path) -> None:
    capture = pipelined_graphs[0]
    result = runner.invoke(build_app, [str(capture), "--layers", "13", "-o", str(tmp_path / "g.parquet")])
    assert result.exit_code != 0
    assert "multiple of 2" in result.output
    assert not (tmp_path / "g.parquet").exists()


@pytest.mark.slow
def test_a_built_pipeline_stage_replays_with_the_program_at_that_count(
    pipelined_graphs, tmp_path: Path
) -> None:
    built = pipelined_graphs[1]
    report = replayed(built, 1, pipelined(12), out=tmp_path / "replay")
    assert report.predicted_peak_bytes > 0
    # The replayed last stage holds what the graph says a 6-layer stage holds.
    assert report.measured_peak_bytes == report.predicted_peak_bytes


def zero_bubble(schedule: str) -> Callable[[int], tuple[str, ...]]:
    """``examples/pp.py`` under a zero-bubble ``schedule`` with a given count of layers in all: four
    stages of a quarter of them, two a rank, each backward split into the inputs' run and a run per
    group of weights."""

    def program(layers: int) -> tuple[str, ...]:
        return (str(EXAMPLES / "pp.py"), "--pp", "2", "--schedule", schedule, "--steps", "50", "--hidden",
                "32", "--vocab", "64", "--batch", "4", "--seq", "8", "--layers-per-stage", str(layers // 4))  # fmt: skip

    return program


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "DualPipeV", "InterleavedZeroBubble"])
def test_a_split_backwards_weight_runs_repeat_with_their_layers(tmp_path: Path, schedule: str) -> None:
    """A zero-bubble schedule at 5 layers a stage built at 4: each stage's weight runs, marked with
    their layers, walk 4 layers as its forward and input gradients do, node for node the graph of
    a capture at 4, its memory to the byte (the last stage's activations, which the program's
    losses keep into the next step, held for 4 layers). V-shaped schedules hold stages r and
    3 - r on rank r, the interleaved one r and r + 2."""
    layout = ("--tp", "1", "--pp", "2", "--dp", "1")
    _, _, built, direct = built_at(tmp_path, layout, zero_bubble(schedule), 20, 16, warmup=3)
    for rank in (0, 1):
        assert _stage_units(built, rank) == _stage_units(direct, rank)
    # Each rank's two stages number their blocks 0-3; the head's weight run (on the rank that holds
    # the last stage: rank 0 in a V) in none. A first stage's backward is not split.
    head_rank = 0 if schedule in ("ZBVZeroBubble", "DualPipeV") else 1
    for rank in (0, 1):
        parts = graph_column(built, gf.PART, np.array([rank]))
        weights = graph_column(built, gf.LAYER, np.array([rank]))[parts == "weights"]
        assert set(weights) == {*range(4), *((-1,) if rank == head_rank else ())}
    static = [read_metadata(g).extra[gf.STATIC_BYTES_KEY] for g in (built, direct)]
    assert static[0] == static[1]
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (built, direct)]
    assert (peaks[0] == peaks[1]).all()


def gpt2_ddp(layers: int) -> tuple[str, ...]:
    return (str(EXAMPLES / "hf_gpt2_ddp.py"), "--steps", "30", "--hidden", "64", "--heads", "2", "--seq", "32",
            "--batch", "4", "--layers", str(layers))  # fmt: skip


def _calls_and_units(graph: Path) -> tuple[list[tuple], Counter]:
    """Rank 0's calls (kind, phase, layer, bytes) in order, and how many compute units of each name
    each phase and layer runs (a gradient's accumulation counted once, split around a call or not)."""
    ranks = np.array([0])
    phase, layer, kind, size, name = (
        graph_column(graph, c, ranks) for c in (gf.PHASE, gf.LAYER, gf.KIND, gf.BYTES, gf.NAME)
    )
    calls = [
        (k, p, int(lay), int(b))
        for p, lay, k, b in zip(phase, layer, kind, size, strict=True)
        if k != "compute"
    ]
    units = Counter(
        (p, int(lay), "AccumulateGrad" if str(n).endswith("AccumulateGrad") else str(n))
        for p, lay, k, n in zip(phase, layer, kind, name, strict=True)
        if k == "compute" and str(n) != REDUCER_SCALE
    )
    return calls, units


@pytest.mark.slow
def test_ddp_buckets_are_planned_again_for_the_layer_count(tmp_path: Path) -> None:
    """Hugging Face's GPT-2 under DistributedDataParallel: its 5 layers fill one bucket (DDP's first
    cap, 1 MiB, reached only by the embedding), its 8 layers two; built at 8 from the 5-layer
    capture, the second bucket's all-reduce is made where the 8-layer capture made it, in layer 2's
    backward, with the same payloads, and memory (DDP's buckets hold a copy of every gradient)
    is that capture's to the byte."""
    pytest.importorskip("transformers")
    _, _, built, graph8 = built_at(tmp_path, ("--dp", "2"), gpt2_ddp, 5, 8)
    (calls, units), (direct_calls, direct_units) = _calls_and_units(built), _calls_and_units(graph8)
    assert calls == direct_calls
    assert [c[2:] for c in calls if c[0] == "collective"] == [(2, 1_065_984), (-1, 804_352)]
    assert units == direct_units
    static = [read_metadata(g).extra[gf.STATIC_BYTES_KEY] for g in (built, graph8)]
    assert static[0] == static[1]
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (built, graph8)]
    assert (peaks[0] == peaks[1]).all()
