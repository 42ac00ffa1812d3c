"""Ranks started together on a host with fewer GPUs than ranks (a pipeline's value pass on one
GPU) share the GPUs and are told so; each gets a GPU of its own where there are enough."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.capture import runner
from prism.capture.runner import CaptureHooks, CaptureOptions, RankBatch
from prism.peers.host_staged import SHARED_GPU_ENV
from prism.schemas.layout import ParallelLayout
from prism.schemas.program import ProgramSpec


def _launched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device: str, gpus: int) -> tuple[list, dict]:
    monkeypatch.setattr(runner.torch.cuda, "device_count", lambda: gpus)
    seen: dict = {}

    def run_processes(launches, *, env, **_) -> None:  # noqa: ANN001
        seen["launches"], seen["env"] = launches, env

    monkeypatch.setattr(runner, "run_processes", run_processes)
    program = ProgramSpec(
        argv=("train.py",), cwd=str(tmp_path), layout=ParallelLayout(tp=1, pp=2, dp=1), device=device
    )
    options = CaptureOptions(program=program, out_dir=tmp_path / "cap")
    runner._run_batch(options, tmp_path, RankBatch(ranks=(0, 1), value_pass=True), CaptureHooks())
    return [launch.local_rank for launch in seen["launches"]], seen["env"]


def test_a_pipelines_stages_share_one_gpu_and_are_told_so(monkeypatch, tmp_path) -> None:
    local_ranks, env = _launched(monkeypatch, tmp_path, "cuda", gpus=1)
    assert local_ranks == [0, 0]
    assert env[SHARED_GPU_ENV] == "1"


def test_enough_gpus_give_each_rank_its_own(monkeypatch, tmp_path) -> None:
    local_ranks, env = _launched(monkeypatch, tmp_path, "cuda", gpus=8)
    assert local_ranks == [0, 1]
    assert SHARED_GPU_ENV not in env


def test_cpu_ranks_keep_a_local_rank_each(monkeypatch, tmp_path) -> None:
    local_ranks, env = _launched(monkeypatch, tmp_path, "cpu", gpus=0)
    assert local_ranks == [0, 1]
    assert SHARED_GPU_ENV not in env
