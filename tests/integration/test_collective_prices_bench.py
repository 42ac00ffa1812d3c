"""benchmarks/collective_prices.py: a program's real collectives beside its graph's prices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.graph.build.cli import app as build_app

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "collective_prices.py"

LAYOUT = ("--tp", "2", "--pp", "1", "--dp", "1")
PROGRAM = (str(ROOT / "examples" / "tp_fsdp.py"), "--tp", "2", "--steps", "50", "--hidden", "32", "--layers", "2",
           "--vocab", "64", "--batch", "2", "--seq", "8")  # fmt: skip
runner = CliRunner()


@pytest.mark.slow
def test_real_calls_and_graph_prices_are_set_side_by_side(tmp_path: Path) -> None:
    real, slice_, graph = tmp_path / "real", tmp_path / "slice", tmp_path / "graph.parquet"
    steps = ("--warmup", "4", "--iterations", "2")
    for out, mode in ((real, ("--real", "all")), (slice_, ())):
        result = runner.invoke(capture_app, [*LAYOUT, *mode, *steps, "-o", str(out), "--", *PROGRAM])
        assert result.exit_code == 0, result.output
    result = runner.invoke(build_app, [str(slice_), *LAYOUT, "-o", str(graph)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "prices.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(real), str(graph), "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "real calls (every rank real) beside the graph's prices" in done.stdout
    (row,) = json.loads(out.read_text())["rows"]  # the tp all-reduces, one size
    assert (row["op"], row["group_size"]) == ("all_reduce", 2)
    # The set-up's weight scatters are not read as calls of the iterations: two all-reduces
    # a block, forward and backward, on both sides.
    assert row["calls_per_iter"] == row["graph_calls_per_iter"] == 4
    assert 0 < row["latency_median_ms"] <= row["paid_ms"] * 4 and row["graph_price_ms"] > 0
    assert row["graph_ms_per_iter"] == pytest.approx(4 * row["graph_price_ms"])


def test_a_missing_capture_is_one_error_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "nothing"), str(tmp_path / "graph.parquet")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout.startswith("error:") and "is not a complete capture" in done.stdout
