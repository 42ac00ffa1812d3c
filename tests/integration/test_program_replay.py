"""prism-replay of a graph of the user's own program: one rank of it runs for real, the rest virtual."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prism.graph.io.parquet import read_metadata
from prism.replay.cli import app as replay_app
from prism.schemas import graph_format as gf
from prism.schemas.replay import ReplayReport
from tests.integration.programs import captured_and_built

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = ("--steps", "50", "--hidden", "32", "--vocab", "64", "--seq", "8", "--batch", "4")
runner = CliRunner()

pytestmark = pytest.mark.slow


def graph_of(tmp_path: Path, layout: tuple[str, ...], *program: str) -> Path:
    return captured_and_built(tmp_path / "cap", layout, program)[1]


def replay(graph: Path, out: Path, *args: str, warmup: int = 5):
    """The replay command's result, as it ended (``programs.replayed`` reads a report that succeeded)."""
    return runner.invoke(replay_app, [str(graph), "-o", str(out), "--warmup", str(warmup), *args])


def test_a_ddp_rank_replays_against_its_programs_graph(tmp_path: Path) -> None:
    layout = ("--tp", "1", "--pp", "1", "--dp", "1024")
    # Iterations of several ms, so that the time check below is not about the co-simulation's own cost.
    graph = graph_of(tmp_path, layout, str(EXAMPLES / "ddp.py"), *TINY, "--layers", "2", "--hidden", "128")
    # DDP rebuilds its buckets in iteration 1 (a broadcast the steady iterations do not make):
    # the replay runs against the graph from the first steady iteration on.
    assert read_metadata(graph).extra[gf.STEADY_FROM_KEY] == 2
    # Timed over the clean iterations from the steady one on: with five warm-up iterations that
    # left so few that one descheduled for a time slice on a loaded CI host doubled their median
    # (10.1 ms against a 4.5 ms prediction, the stall in an optimizer step); eleven leave several.
    result = replay(graph, tmp_path / "replay", "--rank", "777", warmup=11)
    assert result.exit_code == 0, result.output
    report = ReplayReport.from_dict(json.loads((tmp_path / "replay" / "report.json").read_text()))
    (rank,) = report.ranks
    assert rank.rank == 777 and rank.calls_per_iter >= 1
    assert 0.5 * rank.predicted_iter_ms < rank.measured_iter_ms < 2 * rank.predicted_iter_ms
    assert abs(rank.mem_err_pct) < 0.1  # the same tensors as the captured rank, the same iterations
    # One profiled iteration would measure memory where the profiler misses the frees of the
    # iteration before (5-10 % high on torchtitan): refused before anything runs.
    one = replay(graph, tmp_path / "one", "--rank", "777", "--iterations", "1")
    assert one.exit_code == 2 and "--iterations must be at least 2 for a program" in one.output
    assert not (tmp_path / "one").exists()


def test_a_program_that_leaves_its_graph_stops_with_both_sides_named(tmp_path: Path) -> None:
    layout = ("--tp", "1", "--pp", "1", "--dp", "1024")
    graph = graph_of(tmp_path, layout, str(EXAMPLES / "ddp.py"), *TINY, "--layers", "1")
    # Another model than the one captured: its gradient bucket has another size.
    result = replay(
        graph, tmp_path / "replay", "--rank", "3", "--", str(EXAMPLES / "ddp.py"), *TINY, "--layers", "2"
    )
    assert result.exit_code == 2
    assert "the program made all_reduce" in result.output and "but the graph expects" in result.output
    assert not (tmp_path / "replay").exists()


def test_two_real_ddp_ranks_reduce_their_gradients_for_real(tmp_path: Path) -> None:
    # dp=2, both ranks real: DDP's reducer waits on the gradient all-reduce's future, which
    # prism's group takes from the real gloo call between the two processes.
    layout = ("--tp", "1", "--pp", "1", "--dp", "2")
    graph = graph_of(tmp_path, layout, str(EXAMPLES / "ddp.py"), *TINY, "--layers", "2")
    result = replay(graph, tmp_path / "replay", "--rank", "0", "--rank", "1")
    assert result.exit_code == 0, result.output
    report = ReplayReport.from_dict(json.loads((tmp_path / "replay" / "report.json").read_text()))
    assert [r.rank for r in report.ranks] == [0, 1]
    for rank in report.ranks:
        assert rank.calls_per_iter >= 1
        assert abs(rank.mem_err_pct) < 0.1
