"""A pipelined program's graph at another pipeline depth than the one captured: each stage runs
what a capture at that depth runs (its warm-up as 1F1B places it), memory as captured there but
for a buffer freed a step late and a few bytes a stage; refused where the capture cannot tell."""

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
from prism.schemas.graph_format import WAIT_NAME
from tests.integration.programs import built_with, captured_and_built, replayed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACTIVATION = 8 * 32 * 4
"""Bytes of one microbatch's activation between stages (seq 8 x hidden 32, float32): a buffer one
steady step of the 4-stage capture frees a step late, whose place the copied steps keep."""
PER_STAGE = 4
"""Bytes the program holds for each stage of its pipeline (the captured count's, as captured)."""
runner = CliRunner()


def pipelined(pp: int, schedule: str = "1F1B") -> tuple[str, ...]:
    """``examples/pp.py`` at ``pp`` stages of two layers, 8 microbatches."""
    return (str(EXAMPLES / "pp.py"), "--pp", str(pp), "--schedule", schedule, "--steps", "50", "--hidden", "32",
            "--vocab", "64", "--batch", "8", "--microbatches", "8", "--seq", "8", "--layers-per-stage", "2")  # fmt: skip


@pytest.fixture(scope="module")
def depths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """1F1B at 4 and 6 stages captured (every stage), each built at the other's depth."""
    root = tmp_path_factory.mktemp("depth")
    out = {}
    for pp in (4, 6):
        capture, out[f"at{pp}"] = captured_and_built(
            root / f"at{pp}", ("--pp", str(pp), "--roles", "pipeline"), pipelined(pp), warmup=3
        )
        out[f"capture{pp}"] = capture
    out["4to6"] = built_with(out["capture4"], root / "4to6.parquet", "--pp", "6", "--layers", "12")
    out["6to4"] = built_with(out["capture6"], root / "6to4.parquet", "--pp", "4", "--layers", "8")
    return out


def _units(graph: Path, rank: int) -> list[tuple]:
    """A rank's nodes but its waits (where a capture saw a wait() moves by a unit between two
    captures): kind, name, phase, layer, payload and peer, in program order."""
    ranks = np.array([rank])
    columns = [
        graph_column(graph, c, ranks) for c in (gf.KIND, gf.NAME, gf.PHASE, gf.LAYER, gf.BYTES, gf.PEER)
    ]
    keep = columns[1] != WAIT_NAME
    return [tuple(row) for row in zip(*(c[keep].tolist() for c in columns), strict=True)]


@pytest.mark.parametrize(("built", "direct"), [("4to6", "at6"), ("6to4", "at4")])
def test_each_stage_runs_what_a_capture_at_that_depth_runs(depths, built: str, direct: str) -> None:
    pp = read_metadata(depths[direct]).layout["pp"]
    assert read_metadata(depths[built]).layout == read_metadata(depths[direct]).layout
    for rank in range(pp):
        assert _units(depths[built], rank) == _units(depths[direct], rank), f"stage {rank}"


@pytest.mark.parametrize(("built", "direct"), [("4to6", "at6"), ("6to4", "at4")])
def test_memory_is_the_captures_at_that_depth_but_a_send_buffer(depths, built: str, direct: str) -> None:
    static = [np.array(read_metadata(depths[g]).extra[gf.STATIC_BYTES_KEY]) for g in (built, direct)]
    assert (abs(static[0] - static[1]) == 2 * PER_STAGE).all()  # 2 stages more or fewer
    peaks = [simulate(load_sim_graph(depths[g]), iterations=2).peak_bytes for g in (built, direct)]
    assert (abs(peaks[0] - peaks[1]) <= ACTIVATION + 2 * PER_STAGE).all()
    # Where the warm-up holds more microbatches, the first stage's peak is that many activations higher.
    shallow = simulate(load_sim_graph(depths["at4"]), iterations=2).peak_bytes[0]
    deep = simulate(load_sim_graph(depths["4to6"]), iterations=2).peak_bytes[0]
    assert deep > shallow


def test_a_built_stage_replays_with_the_program_at_that_depth(depths, tmp_path: Path) -> None:
    report = replayed(depths["4to6"], 4, pipelined(6), out=tmp_path / "replay")
    assert report.predicted_peak_bytes > 0
    refused = runner.invoke(replay_app, [str(depths["4to6"]), "--rank", "4", "-o", str(tmp_path / "r")])
    assert refused.exit_code != 0 and "pp=6" in refused.output


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--pp", "12", "--layers", "24"), "needs as many microbatches or more"),
        (("--pp", "6"), "a multiple of 6"),
        (("--pp", "1"), "capture with --pp 1"),
    ],
)
def test_depths_the_capture_cannot_give_are_refused(depths, tmp_path: Path, options, says: str) -> None:
    result = runner.invoke(build_app, [str(depths["capture4"]), *options, "-o", str(tmp_path / "g.parquet")])
    assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "g.parquet").exists()
