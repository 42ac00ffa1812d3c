"""The analytic per-rank parameter count behind the memory checks matches the model; a capture
that cannot fit the machine is refused before any process starts."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from prism.capture.preflight import (
    CaptureError,
    check_full_run_fits,
    check_output,
    check_rank_fits,
    stage_parameter_count,
)
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.params import stage_buckets, stage_parameter_shapes
from prism.capture.workloads.gpt.train import GPTWorkload
from prism.peers import BACKEND_NAME, FreeRunningClock, VirtualWorld, activate

CONFIG = GPTConfig(
    layers=8, hidden=64, heads=4, seq_len=16, vocab=256, microbatches=4, tp=2, pp=4, dp=2, grad_bucket_mb=0.02
)


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_stage_parameter_count_matches_the_built_shard(stage: int) -> None:
    rank = CONFIG.layout.rank(tp=1, dp=1, pp=stage)
    activate(VirtualWorld(real_ranks=frozenset({rank}), clock=FreeRunningClock()))
    dist.init_process_group(
        BACKEND_NAME, rank=rank, world_size=CONFIG.layout.world_size, store=dist.HashStore()
    )
    try:
        workload = GPTWorkload(CONFIG)
        assert workload.parameter_count == stage_parameter_count(CONFIG, stage)
        # The graph builder plans DP buckets from these shapes: they must be the model's, in order.
        built = [(name, tuple(p.shape)) for name, p in workload.model.named_parameters()]
        declared = stage_parameter_shapes(CONFIG, stage)
        assert [shape for _, shape in built] == [shape for _, shape in declared]
        assert [b.numel for b in workload.grad_sync.buckets] == [
            b.numel for b in stage_buckets(CONFIG, stage, 4)
        ]
    finally:
        dist.destroy_process_group()


def test_full_run_beyond_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import prism.capture.preflight as preflight

    class Tiny:
        available = 1 * 2**20

    monkeypatch.setattr(preflight.psutil, "virtual_memory", lambda: Tiny)
    with pytest.raises(CaptureError, match="GiB is available"):
        config = GPTConfig(layers=2, hidden=64, heads=2, tp=1, pp=1, dp=2, microbatches=1)
        check_full_run_fits(config.layout, config.device, config)


def test_a_rank_beyond_memory_is_refused_before_it_starts(tmp_path) -> None:
    """--hidden 65536: one rank needs ~1 TiB (weights, gradients, Adam, activations);
    without the check the kernel kills it or it swaps for hours."""
    from prism.capture.runner import CaptureOptions, run_capture

    huge = GPTConfig(layers=2, hidden=65536, heads=2, seq_len=16, vocab=128, microbatches=2, tp=1, pp=2, dp=2)
    with pytest.raises(CaptureError, match="one rank of this model needs about .* GiB"):
        check_rank_fits(huge, "cpu")
    with pytest.raises(CaptureError, match="needs about"):
        run_capture(CaptureOptions(config=huge, out_dir=tmp_path / "cap"))
    assert list(tmp_path.iterdir()) == []
    check_rank_fits(CONFIG, "cpu")  # the tests' own models fit


def test_an_output_in_missing_folders_gets_them(tmp_path) -> None:
    out = tmp_path / "runs" / "today" / "capture"
    check_output(out, overwrite=False)
    assert out.parent.is_dir() and not out.exists()


def test_an_output_under_a_file_is_one_error(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(CaptureError, match="cannot write .*: Not a directory"):
        check_output(tmp_path / "file" / "runs" / "capture", overwrite=False)
