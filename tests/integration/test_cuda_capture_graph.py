"""The graph of a real CUDA capture (recorded on one H200, read here without a GPU)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.build.profiler_overhead import Correction
from prism.graph.io.parquet import read_metadata
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas import graph_format as gf
from prism.schemas.cluster import preset
from prism.schemas.iterations import clean_unprofiled

DATA = Path(__file__).parents[1] / "data" / "cuda_captures" / "ddp_dp1_h200"


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The capture with its Execution Trace unpacked (it is kept gzipped)."""
    out = tmp_path_factory.mktemp("cuda") / "capture"
    shutil.copytree(DATA / "capture", out)
    packed = out / "et" / "rank0.et.json.gz"
    packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
    packed.unlink()
    return out


def test_a_gpu_bound_ranks_graph_predicts_its_real_run(capture: Path, tmp_path: Path) -> None:
    # examples/ddp.py at dp=1 on one GPU: the host, slowed by the profiler, runs 52-58 ms an
    # iteration against 38.5 ms of device work, so the build scales it by whole iterations; DDP's
    # bucket all-reduces take 4-6 ms of that host time, launching into NCCL. Priced by the comm
    # model alone (0 for a group of one), the graph came out 6.5 % short of the real run.
    graph = tmp_path / "graph.parquet"
    build_graph(BuildOptions(capture_dir=capture, out=graph, tp=1, pp=1, dp=1, cluster=preset("h100-ib")))
    scale = read_metadata(graph).extra[gf.TIME_SCALE_KEY]["0"]
    assert scale["launches"] and 0.6 < scale["factor"] < 0.8
    real = json.loads((DATA / "real_run.json").read_text())
    real_ms = np.median(clean_unprofiled(real["iteration_ns"], 10)) / 1e6
    predicted_ms = simulate(load_sim_graph(graph), iterations=2).iteration_ns[0] / 1e6
    assert predicted_ms == pytest.approx(real_ms, rel=0.02)


def test_without_a_profiler_correction_the_calls_launches_stay(capture: Path, tmp_path: Path) -> None:
    # --profiler-correction none: durations as profiled, the calls' launches included, so the
    # graph's iteration is the profiled one (it dropped 4-6 ms of launches when tied to the scale).
    corrected, raw = tmp_path / "corrected.parquet", tmp_path / "raw.parquet"
    for out, correction in ((corrected, Correction.ROLE), (raw, Correction.NONE)):
        options = BuildOptions(capture_dir=capture, out=out, tp=1, pp=1, dp=1, cluster=preset("h100-ib"))
        build_graph(dataclasses.replace(options, profiler_correction=correction))
    assert read_metadata(raw).extra[gf.TIME_SCALE_KEY] is None
    profiled_ms = read_metadata(corrected).extra[gf.TIME_SCALE_KEY]["0"]["profiled_ms"]
    predicted_ms = simulate(load_sim_graph(raw), iterations=2).iteration_ns[0] / 1e6
    assert predicted_ms == pytest.approx(profiled_ms, rel=0.03)
