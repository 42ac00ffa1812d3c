"""A GPU training job's own torch.profiler trace, recorded here, as a graph (``--from-traces``):
its step reproduced within 1 %, on a trace prism was not developed on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prism.graph.build.from_traces import build_from_traces
from prism.graph.sim.predict import predict

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
JOB = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_trace_job.py"


def test_a_gpu_jobs_own_trace_is_reproduced_by_its_graph(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    argv = [
        sys.executable,
        str(JOB),
        "--out",
        str(traces),
        "--steps",
        "4",
        "--hidden",
        "512",
        "--layers",
        "4",
    ]
    subprocess.run(argv, check=True, timeout=600)
    built = build_from_traces(traces, tmp_path / "graph.parquet")
    assert any(s.startswith("cuda stream") for s in built.streams)
    summary = predict(tmp_path / "graph.parquet")
    recorded = built.traced[0].recorded_ns
    assert summary.ranks["iteration_ns"][0] == pytest.approx(recorded, rel=0.01)
