"""A program capture's settings: the command line, the torchrun environment, the job file."""

from __future__ import annotations

import pytest

from prism.capture.workloads.gpt.config import GPTConfig
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import ManifestError, RankJob
from prism.schemas.program import ProgramError, ProgramSpec

LAYOUT = ParallelLayout(tp=2, pp=4, dp=128)


def spec(*argv: str, **more: object) -> ProgramSpec:
    return ProgramSpec(argv=argv, cwd="/work", layout=LAYOUT, **more)


def test_a_script_or_a_module_with_their_own_arguments() -> None:
    script = spec("train.py", "--lr", "3e-4")
    assert (script.script, script.module, script.args) == ("train.py", None, ("--lr", "3e-4"))
    module = spec("-m", "pkg.train", "--steps", "5")
    assert (module.script, module.module, module.args) == (None, "pkg.train", ("--steps", "5"))


@pytest.mark.parametrize("argv", [(), ("-m",)])
def test_no_program_is_an_error(argv: tuple[str, ...]) -> None:
    with pytest.raises(ProgramError, match="no program given"):
        spec(*argv)


def test_the_torchrun_environment_is_the_target_worlds() -> None:
    env = spec("train.py", nproc_per_node=8).torchrun_env(1029)
    assert env["RANK"] == "1029" and env["WORLD_SIZE"] == str(LAYOUT.world_size) == "1024"
    assert env["LOCAL_WORLD_SIZE"] == "8"
    assert env["GROUP_RANK"] == str(1029 // 8) and env["GROUP_WORLD_SIZE"] == "128"
    assert "LOCAL_RANK" not in env  # the launcher's: a device index that exists here


def test_jobs_round_trip_and_name_their_layout() -> None:
    program = RankJob(
        workload="program", program=spec("-m", "x"), real_ranks=(), warmup=3, iterations=2, threads=1
    )
    assert RankJob.from_dict(program.to_dict()) == program
    assert program.layout == LAYOUT and program.device == "cpu"
    config = GPTConfig(tp=1, pp=2, dp=1, layers=2)
    gpt = RankJob(workload="gpt", config=config.to_dict(), real_ranks=None, warmup=3, iterations=2, threads=1)
    assert RankJob.from_dict(gpt.to_dict()) == gpt
    assert gpt.layout == config.layout


def test_a_job_needs_exactly_its_own_settings() -> None:
    with pytest.raises(ManifestError):
        RankJob(
            workload="program", config=GPTConfig().to_dict(), real_ranks=(), warmup=3, iterations=2, threads=1
        )
    with pytest.raises(ManifestError):
        RankJob(workload="gpt", program=spec("t.py"), real_ranks=(), warmup=3, iterations=2, threads=1)
