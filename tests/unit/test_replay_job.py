"""The replay job file (``job.json`` of a replayed rank): what the rank process is told to run."""

from __future__ import annotations

from prism.capture.workloads.gpt.config import GPTConfig
from prism.schemas.manifest import RankJob
from prism.schemas.replay import ReplayJob

PROGRAM = RankJob(
    workload="gpt", config=GPTConfig().to_dict(), real_ranks=(), warmup=3, iterations=1, threads=1
)


def test_the_job_survives_its_file() -> None:
    job = ReplayJob(
        program=PROGRAM, graph="g.parquet", trace_peers=(0, 8), coordinator="/tmp/x/cosim.sock", clock_from=2
    )
    assert ReplayJob.from_dict(job.to_dict()) == job


def test_a_job_file_with_keys_of_older_versions_still_reads() -> None:
    data = ReplayJob(program=PROGRAM, graph="g.parquet").to_dict() | {"background_engine": True}
    assert ReplayJob.from_dict(data) == ReplayJob(program=PROGRAM, graph="g.parquet")
