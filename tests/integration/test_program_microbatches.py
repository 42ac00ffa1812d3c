"""A program built at another microbatch count than the one captured: the graph a capture at
that count gives, node for node, with its memory (a pipeline's but for the batch it draws whole,
which the build's note bounds; gradient accumulation's to the byte)."""

from __future__ import annotations

import re
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
from prism.schemas.graph_format import WAIT_NAME
from tests.integration.programs import captured_and_built, replayed

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAYOUT = ("--tp", "1", "--pp", "2", "--dp", "1")
SEQ = 8
runner = CliRunner()


def pipelined(schedule: str, microbatches: int) -> tuple[str, ...]:
    """``examples/pp.py``: two stages, one sample a microbatch."""
    return (str(EXAMPLES / "pp.py"), "--pp", "2", "--schedule", schedule, "--steps", "50", "--hidden", "32",
            "--vocab", "64", "--batch", str(microbatches), "--seq", str(SEQ), "--layers-per-stage", "3",
            "--microbatches", str(microbatches))  # fmt: skip


@pytest.fixture(scope="module", params=["1F1B", "GPipe"])
def graphs(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str, str]:
    """Six microbatches captured and built at eight, eight captured: (graph of 6, built at 8,
    graph of 8, the build's output, the schedule)."""
    root = tmp_path_factory.mktemp(f"microbatches_{request.param}")
    capture, graph6 = captured_and_built(root / "at6", LAYOUT, pipelined(request.param, 6), warmup=3)
    _, graph8 = captured_and_built(root / "at8", LAYOUT, pipelined(request.param, 8), warmup=3)
    built = root / "at6-built-at8.parquet"
    result = runner.invoke(build_app, [str(capture), "--microbatches", "8", "-o", str(built)])
    assert result.exit_code == 0, result.output
    assert validate_graph(built).ok
    return graph6, built, graph8, result.output, request.param


def _stage_units(graph: Path, rank: int) -> list[tuple]:
    """A rank's nodes but its waits (where a capture saw the program wait for a receive moves by a
    unit between two captures): phase, kind, name, payload, peer."""
    ranks = np.array([rank])
    columns = [graph_column(graph, c, ranks) for c in (gf.PHASE, gf.KIND, gf.NAME, gf.BYTES, gf.PEER)]
    keep = columns[2] != WAIT_NAME
    return [tuple(row) for row in zip(*(c[keep] for c in columns), strict=True)]


def _peaks_beyond(built: Path, graph: Path) -> np.ndarray:
    """Each stage's simulated peak of ``built`` beyond ``graph``'s, once each stage of ``built``
    is seen to run ``graph``'s nodes and to free what it allocates."""
    for rank in (0, 1):
        assert _stage_units(built, rank) == _stage_units(graph, rank)
        ranks = np.array([rank])
        alloc, free = (int(graph_column(built, c, ranks).sum()) for c in (gf.ALLOC_BYTES, gf.FREE_BYTES))
        assert alloc == free
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (built, graph)]
    return peaks[0] - peaks[1]


def _bounds(output: str) -> np.ndarray:
    """Each stage's bound on its peak memory, from the build's notes."""
    text = " ".join(output.split())  # the console wraps the notes
    return np.array(
        [int(b.replace(",", "")) for b in re.findall(r"may be off by up to ([\d,]+) bytes", text)]
    )


def test_each_stage_runs_the_schedule_a_capture_at_that_count_runs(graphs) -> None:
    graph6, built, graph8, _, _ = graphs
    for rank in (0, 1):
        assert _stage_units(built, rank) == _stage_units(graph8, rank)
        assert _stage_units(built, rank) != _stage_units(graph6, rank)
    assert read_metadata(built).build_options["microbatches"] == 8


def test_memory_is_a_capture_at_that_counts_but_for_the_batch_drawn_whole(graphs) -> None:
    graph6, built, graph8, output, _ = graphs
    # pp.py draws each iteration's batch whole, (batch, seq + 1) int64, and keeps it into the
    # next: two samples more are 144 bytes the graph keeps as captured, within the note's bound.
    batch = 2 * (SEQ + 1) * 8
    static = [np.array(read_metadata(g).extra[gf.STATIC_BYTES_KEY]) for g in (built, graph8)]
    assert (static[1] - static[0] == batch).all()
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (graph6, built, graph8)]
    assert (np.abs(peaks[2] - peaks[1]) <= 2 * batch).all()
    # What a capture at 8 holds beyond one at 6 (the outputs kept, a receive buffer a microbatch),
    # the build holds too.
    assert (peaks[2] - peaks[0] > 10 * batch).all()
    # The note bounds each stage's peak by what it allocates outside its microbatches.
    assert "before its first microbatch, most in aten::randint" in output
    assert (np.abs(peaks[2] - peaks[1]) <= _bounds(output)).all()


def test_the_built_graph_replays_with_the_program_at_that_count_and_not_without(
    graphs, tmp_path: Path
) -> None:
    _, built, _, _, schedule = graphs
    refused = runner.invoke(replay_app, [str(built), "--rank", "0", "-o", str(tmp_path / "r")])
    assert refused.exit_code != 0 and "give your program at 8 microbatches" in refused.output
    report = replayed(built, 1, pipelined(schedule, 8), out=tmp_path / "replay")
    # The last stage run for real at 8 microbatches holds what the graph says, but the batch's
    # two samples more.
    assert 0 <= report.measured_peak_bytes - report.predicted_peak_bytes <= 2 * (SEQ + 1) * 8


def test_a_count_the_captured_steady_steps_cannot_reach_is_refused(graphs, tmp_path: Path) -> None:
    capture = graphs[0].with_suffix("")
    result = runner.invoke(
        build_app, [str(capture), "--microbatches", "1", "-o", str(tmp_path / "g.parquet")]
    )
    assert result.exit_code != 0
    assert "--microbatches 1" in result.output and "at least" in result.output
    assert not (tmp_path / "g.parquet").exists()


def accumulating(microbatches: int) -> tuple[str, ...]:
    """``examples/ddp.py`` stepping once every ``microbatches``, the first ones under ``no_sync``."""
    return (str(EXAMPLES / "ddp.py"), "--steps", "40", "--hidden", "32", "--layers", "2", "--vocab", "64",
            "--batch", "2", "--seq", "8", "--accumulate", str(microbatches))  # fmt: skip


def test_gradient_accumulation_at_another_count_is_a_capture_at_that_count(tmp_path: Path) -> None:
    layout = ("--dp", "2")
    capture, _ = captured_and_built(tmp_path / "at4", layout, accumulating(4), warmup=3)
    _, graph6 = captured_and_built(tmp_path / "at6", layout, accumulating(6), warmup=3)
    built = tmp_path / "at4-built-at6.parquet"
    result = runner.invoke(build_app, [str(capture), "--microbatches", "6", "-o", str(built)])
    assert result.exit_code == 0, result.output
    # Each microbatch draws its own batch: no unit outside the steps grows, and the graph is the
    # 6-microbatch capture's, its bucket all-reduces after the last backward, memory to the byte.
    for rank in (0, 1):
        assert _stage_units(built, rank) == _stage_units(graph6, rank)
    peaks = [simulate(load_sim_graph(g), iterations=2).peak_bytes for g in (built, graph6)]
    assert (peaks[0] == peaks[1]).all()


def layered(schedule: str, layers: int, microbatches: int) -> tuple[str, ...]:
    """``examples/pp.py``: two stages of ``layers`` each, one sample a microbatch."""
    return (str(EXAMPLES / "pp.py"), "--pp", "2", "--schedule", schedule, "--steps", "50", "--hidden", "32",
            "--vocab", "64", "--batch", str(microbatches), "--seq", str(SEQ), "--layers-per-stage",
            str(layers), "--microbatches", str(microbatches))  # fmt: skip


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_layers_and_microbatches_change_together_as_a_capture_at_both(schedule: str, tmp_path: Path) -> None:
    """Two stages of 4 layers and 6 microbatches built at 5 and 8, and the other way round: the
    other capture's graph node for node, every iteration freeing what it allocates, memory but
    for the batch drawn whole."""
    small, graph_small = captured_and_built(tmp_path / "small", LAYOUT, layered(schedule, 4, 6), warmup=3)
    large, graph_large = captured_and_built(tmp_path / "large", LAYOUT, layered(schedule, 5, 8), warmup=3)
    batch = 2 * (SEQ + 1) * 8
    for capture, layers, microbatches, same, sign in (
        (small, 10, 8, graph_large, -1),
        (large, 8, 6, graph_small, 1),
    ):
        built = tmp_path / f"{capture.name}-built.parquet"
        result = runner.invoke(
            build_app,
            [str(capture), "--layers", str(layers), "--microbatches", str(microbatches), "-o", str(built)],
        )
        assert result.exit_code == 0, result.output
        assert validate_graph(built).ok
        options = read_metadata(built).build_options
        assert (options["layers"], options["microbatches"]) == (layers, microbatches)
        assert (_peaks_beyond(built, same) == sign * batch).all()


def test_an_interleaved_schedule_grows_by_rounds_and_layers_as_a_capture_at_those_counts(
    tmp_path: Path,
) -> None:
    """Interleaved 1F1B, two stages of 4 layers a rank: 8 microbatches captured (its steady
    state repeats in rounds of 2, one microbatch through both of a rank's stages each) built at
    6, and at 10 with 5 layers a stage (20 in all), are those captures' graphs node for node,
    every iteration freeing what it allocates, memory but for the batch drawn whole; 9 is no
    whole number of rounds."""
    capture, _ = captured_and_built(tmp_path / "at8", LAYOUT, layered("Interleaved1F1B", 4, 8), warmup=3)
    batch = 2 * (SEQ + 1) * 8
    for layers, microbatches in ((4, 6), (5, 10)):
        _, graph = captured_and_built(
            tmp_path / f"at{microbatches}", LAYOUT, layered("Interleaved1F1B", layers, microbatches), warmup=3
        )
        built = tmp_path / f"at8-built-at{microbatches}.parquet"
        changes = ["--microbatches", str(microbatches)] + (
            ["--layers", str(4 * layers)] if layers != 4 else []
        )
        result = runner.invoke(build_app, [str(capture), *changes, "-o", str(built)])
        assert result.exit_code == 0, result.output
        assert (np.abs(_peaks_beyond(built, graph)) == batch).all()
    result = runner.invoke(
        build_app, [str(capture), "--microbatches", "9", "-o", str(tmp_path / "g.parquet")]
    )
    assert result.exit_code != 0 and "rounds of 2 microbatches" in result.output


@pytest.mark.parametrize(
    ("schedule", "captured_layers", "layers"),
    [("InterleavedZeroBubble", 3, 3), ("ZBVZeroBubble", 5, 4), ("DualPipeV", 3, 3)],
)
def test_a_zero_bubble_schedule_grows_by_rounds_as_a_capture_at_that_count(
    schedule: str, captured_layers: int, layers: int, tmp_path: Path
) -> None:
    """Zero bubble: each backward computes the inputs' gradients through the layers, the weights'
    in engine runs of their own after it, which go with that microbatch's step; the V-shaped
    schedules end on backward runs in a row and hand each microbatch between a rank's own stages
    in buffers kept into the next iteration. Built from 8 captured microbatches at 10 (ZBV from 5
    layers a stage at 4 too: a steady layer's blocks a microbatch keeps counted once for each
    layer that copies it), each is the 10-microbatch capture's graph node for node, memory but
    for the batch drawn whole."""
    capture, _ = captured_and_built(tmp_path / "at8", LAYOUT, layered(schedule, captured_layers, 8), warmup=3)
    _, graph = captured_and_built(tmp_path / "at10", LAYOUT, layered(schedule, layers, 10), warmup=3)
    built = tmp_path / "at8-built-at10.parquet"
    changes = ["--layers", str(4 * layers)] if layers != captured_layers else []
    result = runner.invoke(build_app, [str(capture), "--microbatches", "10", *changes, "-o", str(built)])
    assert result.exit_code == 0, result.output
    assert (_peaks_beyond(built, graph) == -2 * (SEQ + 1) * 8).all()
