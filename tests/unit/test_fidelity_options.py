"""prism.fidelity.options: the cases both fidelity benchmarks take, read one way."""

from __future__ import annotations

import argparse

import pytest

from prism.fidelity.cases import DEFAULT_CASES, random_cases
from prism.fidelity.options import add_case_options, case_texts, check_case_options, program_cases
from prism.schemas.layout import LayoutError, ParallelLayout


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_case_options(parser)
    args = parser.parse_args(list(argv))
    check_case_options(parser, args)
    return args


def test_given_cases_come_before_a_draw_and_the_fixed_ones() -> None:
    assert case_texts(parse("--case", "tp=2 layers=2", "--case", "dp=2")) == ["tp=2 layers=2", "dp=2"]
    assert case_texts(parse("--random", "3", "--seed", "7")) == random_cases(3, 7)
    assert case_texts(parse()) == list(DEFAULT_CASES)


def test_programs_are_split_as_a_shell_would_and_share_the_layout_and_device() -> None:
    args = parse(
        "--program", "examples/ddp.py --hidden 64", "--program", "-m pkg.train --name 'a b'",
        "--dp", "2", "--device", "cuda",
    )  # fmt: skip
    cases = program_cases(args)
    assert [c.argv for c in cases] == [
        ("examples/ddp.py", "--hidden", "64"),
        ("-m", "pkg.train", "--name", "a b"),
    ]
    assert {c.layout for c in cases} == {ParallelLayout(tp=1, pp=1, dp=2)}
    assert {c.device for c in cases} == {"cuda"}


def test_a_program_can_be_captured_at_fewer_layers_and_built_at_its_own() -> None:
    args = parse(
        "--program",
        "train.py --layers 80",
        "--capture-program",
        "train.py --layers 5",
        "--build-layers",
        "80",
    )
    (case,) = program_cases(args)
    assert case.argv == ("train.py", "--layers", "80")
    assert (case.captured_argv, case.layers) == (("train.py", "--layers", "5"), 80)
    assert "built at 80 layers from train.py --layers 5" in case.label
    (plain,) = program_cases(parse("--program", "train.py"))
    assert (plain.captured_argv, plain.layers) == (None, None)


def test_a_layout_that_cannot_exist_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match="dp must be a positive integer"):
        program_cases(parse("--program", "train.py", "--dp", "0"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--program", "train.py", "--case", "tp=2"), "separate runs"),
        (("--random", "2", "--case", "tp=2"), "draws the cases"),
        (("--repeats", "0"), "--repeats must be at least 1"),
        (("--warmup", "1"), "--warmup must be at least"),
        (("--program", "a.py", "--capture-program", "b.py"), "go together"),
        (
            ("--program", "a.py", "--program", "c.py", "--capture-program", "b.py", "--build-layers", "8"),
            "exactly one",
        ),
        (("--program", "a.py", "--capture-program", "b.py", "--build-layers", "0"), "at least 1"),
    ],
)
def test_options_that_do_not_go_together_are_one_error(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(*argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "slice_load", "replay_load"),
    [((), True, True), (("--slice-alone",), False, True), (("--replay-alone",), True, False),
     (("--slice-alone", "--replay-alone"), False, False)],
)  # fmt: skip
def test_the_load_beside_slices_and_beside_replays_is_switched_apart(
    benchmark_script, flags: tuple[str, ...], slice_load: bool, replay_load: bool
) -> None:
    from prism.schemas.cluster import preset

    fidelity = benchmark_script("fidelity")
    settings = fidelity.settings_of(fidelity.parse_args(["--random", "2", *flags]), preset("h100-ib"))
    assert (settings.slice_load, settings.replay_load) == (slice_load, replay_load)
