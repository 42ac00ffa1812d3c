"""A tiny real capture (tp=1 pp=2 dp=2) and its graph, made once for the tests that only read
them (the fuzz tests, the exports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.capture.runner import CaptureOptions, run_capture
from prism.graph.build.builder import BuildOptions, build_graph
from prism.schemas.cluster import preset
from prism.schemas.workload import GPTConfig

FUZZ_CONFIG = GPTConfig(layers=2, hidden=32, heads=2, seq_len=16, vocab=128, microbatches=2, tp=1, pp=2, dp=2)


@pytest.fixture(scope="session")
def fuzz_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "capture"
    run_capture(CaptureOptions(config=FUZZ_CONFIG, out_dir=out, warmup=3, iterations=1))
    return out


@pytest.fixture(scope="session")
def fuzz_graph(fuzz_capture: Path) -> Path:
    out = fuzz_capture.parent / "graph.parquet"
    build_graph(BuildOptions(capture_dir=fuzz_capture, out=out, tp=1, pp=2, dp=2, cluster=preset("h100-ib")))
    return out
