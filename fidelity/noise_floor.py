"""The error a perfect prediction would show: every rank real, compared with every rank real (A/A).

A fidelity record's error mixes what prism gets wrong with how far the machine moves between the
runs it compares. This measures the second alone. Each repeat runs the case for real where the
fidelity run measures its real side, and once more where the fidelity run replays (the *twin*
run): for a case of the built-in model, real, twin, real, the twin against the mean of the two
around it (``RunSettings.bracket``, as the replay is); for a program, real then twin, as its
real run and replay follow each other. The twin's records (source ``floor``) go through the same
pairing as a prediction's (``paired_records``): their iteration error, per-phase errors and
confidence interval are what a prediction exactly as good as the real program scores under the
same repeats on the same machine. A target below that floor cannot be told from noise there.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from prism.capture.workloads.gpt.config import GPTConfig
from prism.fidelity.case import Progress, fit_window, repeat_dir
from prism.fidelity.cases import case_label
from prism.fidelity.compare import paired_records
from prism.fidelity.measure import RankRun, RunSettings, bracketed, measure_real, unstolen
from prism.fidelity.program_case import ProgramCase, real_program_runs

FLOOR = "floor"
"""The records' source: a second real run standing where the prediction stands."""

RealRun = Callable[[Path, str], dict[int, RankRun]]
"""Runs every rank for real into the named folder of a repeat's directory; each rank's run."""


def case_floor(
    config: GPTConfig, repeats: int, settings: RunSettings | None = None, progress: Progress | None = None
) -> list[dict]:
    """A/A records of a built-in model's case: each repeat real, twin, real (or real, twin
    without ``settings.bracket``)."""
    label = case_label(config)
    settings = fit_window(
        settings or RunSettings(), partial(measure_real, config), label, progress or (lambda _: None)
    )

    def run(root: Path, name: str) -> dict[int, RankRun]:
        return measure_real(config, settings, root / name)

    return _floor(label, repeats, settings, progress, run, bracket=settings.bracket)


def program_floor(
    case: ProgramCase, repeats: int, settings: RunSettings | None = None, progress: Progress | None = None
) -> list[dict]:
    """A/A records of a program under torchrun: each repeat real, then twin."""
    say = progress or (lambda _: None)
    settings = fit_window(settings or RunSettings(), partial(real_program_runs, case), case.label, say)

    def run(root: Path, name: str) -> dict[int, RankRun]:
        return real_program_runs(case, settings, root / name)

    return _floor(case.label, repeats, settings, progress, run, bracket=False)


def _floor(
    label: str, repeats: int, settings: RunSettings, progress: Progress | None, run: RealRun, *, bracket: bool
) -> list[dict]:
    say = progress or (lambda _: None)
    real, twin = [], []
    for repeat in range(repeats):
        with repeat_dir(settings, label, repeat) as root:
            say(f"[{label}] repeat {repeat + 1}/{repeats}: every rank real, then its twin run")

            def kept(name: str, root: Path = root) -> dict[int, RankRun]:
                return unstolen(partial(run, root, name), settings, root / name, say)

            before = kept("real")
            twin.append(kept("twin"))
            real.append(bracketed(before, kept("real_after")) if bracket else before)
    return paired_records(label, real, twin, FLOOR)


def beside_floor(records: list[dict], floors: list[dict]) -> list[dict]:
    """Each record of a fidelity run (any source) whose case and rank have a floor record: its
    iteration error beside the floor's (both median against median over their repeats)."""
    floor = {(f["case"], f["rank"]): f for f in floors}
    return [
        {
            "case": r["case"],
            "rank": r["rank"],
            "source": r["source"],
            "err_pct": r["iter_err_pct"],
            "floor_err_pct": floor[r["case"], r["rank"]]["iter_err_pct"],
        }  # fmt: skip
        for r in records
        if (r["case"], r["rank"]) in floor and r["source"] != FLOOR
    ]
