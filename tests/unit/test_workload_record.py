"""The built-in workload's record as the generic stages read it: its shape and nothing else."""

from __future__ import annotations

import pytest

from prism.capture.workloads.gpt.config import GPTConfig
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import ManifestError, RankJob
from prism.schemas.pipeline_shape import PipelineShape, ShapeError
from prism.schemas.workload import RecordError, record_device, record_layout, record_shape, reshaped

CONFIG = GPTConfig(layers=8, hidden=64, heads=4, microbatches=4, tp=2, pp=2, dp=4, device="cpu")


def test_the_record_names_the_gpts_layout_device_and_shape() -> None:
    record = CONFIG.to_dict()
    assert record_layout(record) == CONFIG.layout
    assert record_device(record) == "cpu"
    assert record_shape(record) == {"tp": 2, "pp": 2, "dp": 4, "layers": 8, "microbatches": 4}
    shape = PipelineShape.of_record(record)
    assert shape.layout == CONFIG.layout
    assert [shape.stage_layers(s) for s in range(2)] == [CONFIG.stage_layers(s) for s in range(2)]


def test_a_reshaped_record_keeps_every_other_setting_and_is_the_gpts_own() -> None:
    target = reshaped(CONFIG.to_dict(), pp=4, dp=16, layers=16, microbatches=8)
    assert GPTConfig.from_dict(target) == GPTConfig(
        **{**CONFIG.to_dict(), "pp": 4, "dp": 16, "layers": 16, "microbatches": 8}
    )
    with pytest.raises(RecordError, match="hidden"):
        reshaped(CONFIG.to_dict(), hidden=128)  # the model is the workload's, not the build's


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"pp": 0}, "pp must be a positive integer"),
        ({"layers": True}, "layers must be"),
        ({"tp": None}, "tp must"),
    ],
)
def test_a_record_without_a_shape_is_refused_in_one_line(change: dict, error: str) -> None:
    with pytest.raises(RecordError, match=error):
        record_shape({**CONFIG.to_dict(), **change})
    with pytest.raises(ShapeError, match=error):
        PipelineShape.of_record({**CONFIG.to_dict(), **change})


def test_a_shape_the_1f1b_schedule_cannot_run_is_refused() -> None:
    with pytest.raises(ShapeError, match=r"layers \(6\) must be divisible by pp \(4\)"):
        PipelineShape(tp=1, pp=4, dp=1, layers=6, microbatches=4)
    with pytest.raises(ShapeError, match=r"microbatches \(2\) must be at least pp \(4\)"):
        PipelineShape(tp=1, pp=4, dp=1, layers=8, microbatches=2)


def test_a_job_reads_its_layout_from_the_record_and_refuses_a_bad_one() -> None:
    job = RankJob(workload="gpt", config=CONFIG.to_dict(), real_ranks=(), warmup=3, iterations=1, threads=1)
    assert job.layout == ParallelLayout(tp=2, pp=2, dp=4) and job.device == "cpu"
    assert RankJob.from_dict(job.to_dict()) == job
    with pytest.raises(ManifestError, match="device must be one of cpu, cuda"):
        RankJob(workload="gpt", config={**CONFIG.to_dict(), "device": "tpu"}, real_ranks=(), warmup=3,
                iterations=1, threads=1)  # fmt: skip
