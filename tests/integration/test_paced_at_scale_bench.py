"""Smoke test of benchmarks/paced_at_scale.py on the checked-in tiny graph: a paced capture of
every role, compared rank by rank with a slice of the same job; no speed claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.graph.graph_io import read_metadata
from prism.schemas.manifest import read_manifest
from prism.schemas.workload import GPTConfig

TINY = Path(__file__).parents[1] / "data" / "tiny_graph.parquet"


@pytest.fixture
def paced_at_scale(benchmark_module):
    return benchmark_module("paced_at_scale")


def test_every_role_is_paced_and_compared_with_its_slice(paced_at_scale, tmp_path: Path, capsys) -> None:
    config = GPTConfig.from_dict(read_metadata(TINY).model)
    slice_dir, work = tmp_path / "slice", tmp_path / "work"
    roles = sorted(config.layout.roles().values())
    run_capture(CaptureOptions(config=config, real=RealMode.ROLES, warmup=3, iterations=1, out_dir=slice_dir))
    args = [str(TINY), str(slice_dir), "--engine", "fg", "--warmup", "3", "--iterations", "1"]
    assert paced_at_scale.main([*args, "--work-dir", str(work), "--no-build"]) == 0
    assert "slice graph: job iteration" in capsys.readouterr().out
    paced = read_manifest(work / "paced-fg")
    own, costs = paced_at_scale.own_times(paced), paced_at_scale.engine_times(work / "paced-fg", paced)
    assert sorted(own) == sorted(costs) == roles
    # Own time is wall time less held time: what is left of an iteration once prism let go.
    assert all(unprofiled > 0 and profiled > 0 for unprofiled, profiled in own.values())
    assert all(engine > 0 and stall >= 0 for engine, stall in costs.values())


def test_an_unknown_engine_or_a_missing_slice_is_one_error_line(
    paced_at_scale, tmp_path: Path, capsys
) -> None:
    assert paced_at_scale.main([str(TINY), str(tmp_path), "--engine", "gpu"]) == 2
    assert paced_at_scale.main([str(TINY), str(tmp_path / "none")]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("error: ") for e in errors)
