"""Capture on CUDA: the slice records GPU kernels, and a world of one GPU per rank runs on NCCL."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas.cluster import preset
from prism.schemas.comm_log import read_comm_log
from prism.schemas.manifest import CaptureFiles, read_manifest

pytestmark = pytest.mark.gpu

SMALL = dict(layers=4, hidden=128, heads=4, seq_len=64, vocab=512, microbatches=4, device="cuda")


def kernels(trace_path: Path) -> list[dict]:
    with gzip.open(trace_path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel"]


def test_slice_on_cuda_records_kernels(tmp_path: Path) -> None:
    config = GPTConfig(**SMALL, tp=2, pp=4, dp=8)
    out = tmp_path / "cap"
    run_capture(CaptureOptions(config=config, out_dir=out, warmup=1, iterations=1))
    manifest = read_manifest(out)
    assert manifest.device != "cpu"
    files = CaptureFiles(out)
    for r in manifest.ranks:
        assert len(kernels(files.kineto(r.rank))) > 50
        assert r.result.peak_device_bytes and r.result.peak_device_bytes > 0
        assert r.result.static_bytes and 0 < r.result.static_bytes < r.result.peak_device_bytes


def test_the_graph_of_a_cuda_slice_predicts_its_peak_device_memory(tmp_path: Path) -> None:
    # The device holds more than the model's state (cuBLAS workspaces): the graph takes each
    # stage's static bytes as captured, and predicts each captured rank's peak allocator bytes.
    config = GPTConfig(**SMALL, tp=2, pp=2, dp=2)
    out = tmp_path / "cap"
    run_capture(CaptureOptions(config=config, out_dir=out, warmup=3, iterations=2))
    graph = tmp_path / "graph.parquet"
    build_graph(BuildOptions(capture_dir=out, out=graph, tp=2, pp=2, dp=2, cluster=preset("h100-ib")))
    result = simulate(load_sim_graph(graph))
    for r in read_manifest(out).ranks:
        measured = r.result.peak_device_bytes
        assert abs(int(result.peak_bytes[r.rank]) - measured) <= 0.001 * measured


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for a real NCCL pair")
def test_full_run_on_nccl(tmp_path: Path) -> None:
    config = GPTConfig(**SMALL, tp=2, pp=1, dp=1)
    out = tmp_path / "cap"
    run_capture(CaptureOptions(config=config, out_dir=out, real=RealMode.ALL, warmup=0, iterations=1))
    for rank in (0, 1):
        calls = read_comm_log(CaptureFiles(out).comm(rank)).calls
        assert calls and all(c.delegated for c in calls)
