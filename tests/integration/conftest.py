"""A tiny real capture (tp=1 pp=2 dp=2) and its graph, and a graph of GPU streams built from a
public GPU trace, made once for the tests that only read them (the fuzz tests, the exports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.capture.runner import CaptureOptions, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.build.from_traces import build_from_traces
from prism.schemas.cluster import preset

GPU_TRACES = Path(__file__).resolve().parents[1] / "data" / "gpu_traces"
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


@pytest.fixture(scope="session")
def fuzz_lane_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The graph of the public 2-rank NCCL DDP trace's last step: CPU threads and GPU streams."""
    traces = tmp_path_factory.mktemp("lanes") / "traces"
    traces.mkdir()
    (traces / "rank0.json.gz").write_bytes((GPU_TRACES / "nccl_ddp_rank0.json.gz").read_bytes())
    out = traces.parent / "graph.parquet"
    build_from_traces(traces, out)
    return out
