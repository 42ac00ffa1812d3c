"""The replay job file (``job.json`` of a replayed rank): what the rank process is told to run."""

from __future__ import annotations

import pytest

from prism.schemas.manifest import RankJob
from prism.schemas.replay import ReplayJob
from prism.schemas.workload import GPTConfig

PROGRAM = RankJob(workload="gpt", config=GPTConfig(), real_ranks=(), warmup=3, iterations=1, threads=1)


@pytest.mark.parametrize("background", [None, True, False])
def test_where_the_engine_runs_survives_the_job_file(background: bool | None) -> None:
    job = ReplayJob(program=PROGRAM, graph="g.parquet", trace_peers=(0, 8), background_engine=background)
    assert ReplayJob.from_dict(job.to_dict()) == job


def test_a_job_written_before_the_option_leaves_it_to_the_graph_size() -> None:
    data = ReplayJob(program=PROGRAM, graph="g.parquet").to_dict()
    del data["background_engine"]
    assert ReplayJob.from_dict(data).background_engine is None
