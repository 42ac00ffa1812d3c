"""benchmarks/replay_phase_fix.py: the graph edit it replays against, and its bad input; the
replays themselves are those of test_fidelity_bench."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prism.graph.graph_io import read_metadata, read_rank
from prism.graph.simulate import load_sim_graph, simulate
from prism.schemas.layout import ParallelLayout

TINY = Path(__file__).parents[1] / "data" / "tiny_graph.parquet"


@pytest.fixture
def phase_fix(benchmark_module):
    return benchmark_module("replay_phase_fix")


def test_only_the_phase_compute_is_scaled(phase_fix, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed.parquet"
    phase_fix.with_phase_scaled(TINY, fixed, "optim", 0.5)
    assert read_metadata(fixed) == read_metadata(TINY)
    for rank in range(ParallelLayout.from_dict(read_metadata(TINY).layout).world_size):
        before, after = read_rank(TINY, rank).to_pandas(), read_rank(fixed, rank).to_pandas()
        picked = (before["phase"] == "optim") & (before["kind"] == "compute")
        assert picked.any()
        for column in ("dur_ns", "gap_ns"):
            assert np.array_equal(after.loc[picked, column], np.round(before.loc[picked, column] * 0.5))
        unchanged = before.drop(columns=["dur_ns", "gap_ns"])
        assert after.drop(columns=["dur_ns", "gap_ns"]).equals(unchanged)
        assert after.loc[~picked, ["dur_ns", "gap_ns"]].equals(before.loc[~picked, ["dur_ns", "gap_ns"]])
    # A shorter optimizer step, a shorter iteration.
    assert (
        simulate(load_sim_graph(fixed)).iteration_ns.max() < simulate(load_sim_graph(TINY)).iteration_ns.max()
    )


def test_a_run_without_paced_repeats_is_one_error_line(phase_fix, tmp_path: Path, capsys) -> None:
    case = "tp=2 pp=1 dp=1 layers=2 hidden=32 heads=2"
    assert phase_fix.main([str(tmp_path), str(tmp_path / "out"), "--case", case]) == 2
    assert phase_fix.main([str(tmp_path), str(tmp_path / "out"), "--case", "tp=two"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("error: ") for e in errors)


def test_a_correction_needs_the_spec_to_rebuild_with(phase_fix, tmp_path: Path, capsys) -> None:
    case = "tp=2 pp=1 dp=1 layers=2 hidden=32 heads=2"
    argv = [str(tmp_path), str(tmp_path / "out"), "--case", case, "--correction", "role"]
    with pytest.raises(SystemExit) as stopped:
        phase_fix.main(argv)
    assert stopped.value.code == 2 and "--correction and --spec go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        phase_fix.main([*argv, "--phase", "optim"])  # one second graph or the other
    assert phase_fix.main([*argv, "--spec", str(tmp_path / "missing.toml")]) == 2  # no paced repeats
