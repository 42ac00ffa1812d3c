"""prism.fidelity.report: the records table's caption sums its records up."""

from __future__ import annotations

from prism.fidelity.report import case_ids, records_table


def record(rank: int, err: float, aa: float | None) -> dict:
    return {
        "case": "tp=2", "rank": rank, "real_iter_ms": 10.0, "real_sem_pct": 1.0, "pred_iter_ms": 10 + err / 10,
        "iter_err_pct": err, "paired_err_pct": err, "paired_se_pct": None, "real_peak_bytes": 2**20,
        "pred_peak_bytes": 2**20, "mem_err_pct": 0.0, "within_noise": abs(err) < 2,
        "real_bracket_drift_pct": None, "real_after_vs_before_pct": aa,
    }  # fmt: skip


def test_the_caption_gives_the_mean_errors_and_the_a_a_error_of_the_records_that_have_one() -> None:
    records = [record(0, +4.0, -3.0), record(1, -2.0, None), record(2, 1.0, +1.0)]
    caption = records_table(records, case_ids(records), "replay").caption
    assert "mean |iteration error| 2.3%" in caption  # (4 + 2 + 1) / 3
    assert "(A/A): mean |error| 2.0%" in caption  # (3 + 1) / 2: the record without one left out
    assert "1 of 3 errors within how far the real side itself moved" in caption


def test_records_without_an_a_a_error_say_nothing_of_it() -> None:
    records = [record(0, +4.0, None)]
    assert "A/A" not in records_table(records, case_ids(records)).caption
