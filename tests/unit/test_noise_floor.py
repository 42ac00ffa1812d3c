"""prism.fidelity.noise_floor: the twin run is paired as a prediction would be, against the real runs around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism.fidelity.measure import RankRun, RunSettings
from prism.fidelity.noise_floor import FLOOR, _floor, beside_floor


def _run(ms: float) -> RankRun:
    return RankRun(iter_ns=ms * 1e6, peak_bytes=1000, parts_ms={}, dynamic_bytes=0)


class Runs:
    """Every rank's real runs of a repeat, by the folder each is made in; the calls in order."""

    def __init__(self, times_ms: dict[str, list[float]]) -> None:
        self.times_ms = {name: iter(times) for name, times in times_ms.items()}
        self.calls: list[str] = []

    def __call__(self, root: Path, name: str) -> dict[int, RankRun]:
        self.calls.append(name)
        ms = next(self.times_ms[name])
        return {0: _run(ms), 1: _run(ms * 1.1)}


def test_a_bracketed_twin_is_compared_with_the_mean_of_the_real_runs_around_it(tmp_path: Path) -> None:
    runs = Runs({"real": [100.0, 90.0], "twin": [104.0, 97.0], "real_after": [110.0, 100.0]})
    records = _floor("case", 2, RunSettings(work_dir=tmp_path), None, runs, bracket=True)
    # Each repeat: real, twin, real again, in that order (the twin stands where a replay does).
    assert runs.calls == ["real", "twin", "real_after"] * 2
    assert [r["rank"] for r in records] == [0, 1] and {r["source"] for r in records} == {FLOOR}
    rank0 = records[0]
    assert rank0["real_repeats_ms"] == [105.0, 95.0]  # the means of the runs around each twin
    assert rank0["pred_repeats_ms"] == [104.0, 97.0]
    assert rank0["iter_err_pct"] == pytest.approx((100.5 - 100.0) / 100.0 * 100, abs=0.01)
    assert rank0["real_bracket_drift_pct"] == pytest.approx(10.5, abs=0.1)  # 10 % and 11.1 %
    # Each repeat's own error too, as a prediction's: -0.95 % and +2.1 %.
    assert rank0["paired_err_pct"] == pytest.approx((-0.952 + 2.105) / 2, abs=0.01)


def test_without_a_bracket_the_twin_follows_one_real_run(tmp_path: Path) -> None:
    runs = Runs({"real": [100.0, 120.0, 110.0], "twin": [90.0, 130.0, 110.0]})
    records = _floor("program", 3, RunSettings(work_dir=tmp_path), None, runs, bracket=False)
    assert runs.calls == ["real", "twin"] * 3
    assert records[1]["real_repeats_ms"] == pytest.approx([110.0, 132.0, 121.0])
    assert records[1]["iter_err_pct"] == 0.0 and records[1]["real_bracket_drift_pct"] is None


def test_each_fidelity_record_is_set_beside_the_floor_of_its_case_and_rank() -> None:
    floors = [
        {"case": "A", "rank": 0, "source": FLOOR, "iter_err_pct": 1.5},
        {"case": "A", "rank": 1, "source": FLOOR, "iter_err_pct": -4.0},
    ]
    records = [
        {"case": "A", "rank": 0, "source": "simulation", "iter_err_pct": -7.0},
        {"case": "A", "rank": 0, "source": "replay", "iter_err_pct": 2.0},
        {"case": "A", "rank": 1, "source": "simulation", "iter_err_pct": 3.0},
        {"case": "B", "rank": 0, "source": "simulation", "iter_err_pct": 9.0},  # no floor measured
    ]
    rows = beside_floor(records, floors)
    assert [(r["source"], r["err_pct"], r["floor_err_pct"]) for r in rows] == [
        ("simulation", -7.0, 1.5),
        ("replay", 2.0, 1.5),
        ("simulation", 3.0, -4.0),
    ]
