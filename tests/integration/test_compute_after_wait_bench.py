"""Smoke test of benchmarks/compute_after_wait.py: every mode runs, the JSON holds one median per round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def bench(benchmark_module):
    return benchmark_module("compute_after_wait")


@pytest.mark.slow
def test_every_mode_gives_a_median_per_round(bench, tmp_path: Path) -> None:
    out = tmp_path / "caw.json"
    argv = ["--rounds", "1", "--chunks", "20", "--matmuls", "1", "--pause-ms", "0.1", "--json", str(out)]
    assert bench.main(argv) == 0
    medians = json.loads(out.read_text())["medians_us"]
    assert set(medians) == set(bench.MODES)
    assert all(len(values) == 1 and values[0] > 0 for values in medians.values())


def test_bad_arguments_exit_2(bench) -> None:
    assert bench.main(["--chunks", "3"]) == 2
