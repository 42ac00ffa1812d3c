"""Megatron-core, unmodified, on CUDA: a two-stage pipeline captured on one GPU (its value pass runs
both stages there, their transfers through host memory), built with its transfers, each captured
rank's peak device memory predicted, a last-stage rank replayed to the byte."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from prism.graph.sim.load import graph_column, load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas.graph_format import NodeKind
from prism.schemas.manifest import read_manifest
from tests.integration.programs import captured_and_built, replayed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LAYOUT = ("--device", "cuda", "--tp", "1", "--pp", "2", "--dp", "2")
PROGRAM = (
    str(EXAMPLES / "megatron_gpt.py"), "--tp", "1", "--pp", "2", "--steps", "20", "--layers", "4",
    "--hidden", "256", "--heads", "4", "--vocab", "1024", "--seq", "128", "--micro-batch", "2",
    "--microbatches", "4",
)  # fmt: skip


def test_a_megatron_pipeline_is_captured_on_one_gpu_built_and_replayed(tmp_path: Path) -> None:
    capture, graph = captured_and_built(tmp_path / "cap", LAYOUT, PROGRAM, warmup=5)
    kinds = graph_column(graph, "kind")
    # 1F1B, 4 microbatches: an activation forward and a gradient back per microbatch and pipeline
    assert (kinds == NodeKind.SEND).sum() == (kinds == NodeKind.RECV).sum() == 2 * 4 * 2
    result = simulate(load_sim_graph(graph))
    for r in read_manifest(capture).ranks:
        measured = r.result.peak_device_bytes
        assert abs(int(result.peak_bytes[r.rank]) - measured) <= 0.001 * measured
    report = replayed(graph, 2)  # the last stage of the first pipeline (tp fastest, then dp, then pp)
    assert report.mem_err_pct is not None and abs(report.mem_err_pct) < 0.1
