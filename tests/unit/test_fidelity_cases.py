"""Fidelity case strings: the job, what its slice captures, and labels that read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.fidelity import CaseError, RunSettings, captured_config, case_label, parse_case
from prism.fidelity.case import case_dir, repeat_dir

JOB = "tp=1 pp=2 dp=1 layers=8 hidden=64 heads=2 seq=16 mbs=1 microbatches=8"


def test_a_case_captures_its_own_job_unless_it_says_otherwise():
    assert captured_config(JOB) == parse_case(JOB)
    text = f"{JOB} captured_layers=4 captured_microbatches=2"
    job, captured = parse_case(text), captured_config(text)
    assert (job.layers, job.microbatches) == (8, 8)
    assert (captured.layers, captured.microbatches) == (4, 2)
    assert captured.hidden == job.hidden and captured.pp == job.pp


def test_label_names_what_was_captured_and_reads_back():
    text = f"{JOB} captured_dp=1 captured_microbatches=4"
    job, captured = parse_case(text), captured_config(text)
    label = case_label(job, captured)
    assert label.endswith(" captured_microbatches=4")  # dp equals the job's: not named
    assert parse_case(label) == job and captured_config(label) == captured
    assert case_label(job) == case_label(job, job)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{JOB} captured_tp=2", "captured_dp, captured_layers, captured_microbatches"),
        (f"{JOB} captured_layers=x", "cannot read 'x'"),
        (f"{JOB} captured_layers=3", "as captured"),  # 3 layers do not split over 2 stages
    ],
)
def test_bad_captured_keys_are_one_line_errors(text, message):
    with pytest.raises(CaseError, match=message):
        captured_config(text)


def test_random_cases_are_valid_reproducible_and_vary():
    from prism.fidelity.cases import MAX_CASE_GFLOP, _case_gflop, random_cases

    cases = random_cases(30, seed=7)
    assert cases == random_cases(30, seed=7) and cases != random_cases(30, seed=8)
    assert len(set(cases)) > 25
    configs = [parse_case(text) for text in cases]
    assert all(c.layout.world_size == 2 for c in configs)
    assert {(c.tp, c.pp, c.dp) for c in configs} == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}
    assert all(_case_gflop(c) <= MAX_CASE_GFLOP for c in configs)
    assert {c.dtype for c in configs} == {"float32", "bfloat16"}
    assert all(case_label(c) == text for c, text in zip(configs, cases, strict=True))


def test_each_case_keeps_its_repeats_apart_under_one_work_dir(tmp_path: Path) -> None:
    kept = RunSettings(work_dir=tmp_path)
    roots = []
    for label in ("examples/ddp.py --steps 40 (dp=2)", "examples/fsdp2.py --steps 40 (dp=2)"):
        with repeat_dir(kept, label, 0) as root:
            (root / "capture").mkdir()  # what a repeat writes
            roots.append(root)
    assert roots[0] != roots[1] and all(r.name == "repeat0" and (r / "capture").is_dir() for r in roots)
    with pytest.raises(FileExistsError), repeat_dir(kept, "examples/ddp.py --steps 40 (dp=2)", 0):
        pass  # a repeat never runs over an earlier one's files
    with repeat_dir(RunSettings(), "any", 0) as temporary:
        assert temporary.is_dir()
    assert not temporary.exists()  # without a work dir nothing is kept


def test_a_program_whose_command_line_is_too_long_for_a_folder_name_keeps_its_repeats_apart(tmp_path: Path):
    long = "-m torchtitan.train " + " ".join(f"--parallelism.option_{i} 2" for i in range(12))
    kept = RunSettings(work_dir=tmp_path)
    with (
        repeat_dir(kept, f"{long} (tp2_pp2)", 0) as first,
        repeat_dir(kept, f"{long} (tp2_pp2_ep2)", 0) as second,
    ):
        pass
    assert first.is_dir() and second.is_dir() and first != second  # same start, own digests
    assert first.parent.name.startswith("-m_torchtitan.train_--parallelism.option_0_2")
    assert case_dir(tmp_path, f"{long} (tp2_pp2)") == first.parent  # found again where it was kept
