"""benchmarks/noise_floor.py: every rank real against its twin real run, on one tiny case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prism.fidelity import case_label, parse_case
from prism.fidelity.explain import PHASES
from tests.integration.test_fidelity_bench import RECORD_TYPES, TINY, run_script


@pytest.mark.slow
def test_each_repeat_runs_real_twin_real_and_sets_the_floor_beside_a_fidelity_run(tmp_path: Path) -> None:
    label = case_label(parse_case(TINY))
    against = tmp_path / "fidelity.json"
    fidelity = [
        {"case": label, "rank": 0, "source": "simulation", "iter_err_pct": -3.0},
        {"case": label, "rank": 1, "source": "replay", "iter_err_pct": 2.5},
    ]
    against.write_text(json.dumps({"records": fidelity}))
    out = tmp_path / "floor.json"
    argv = ["--case", TINY, "--repeats", "2", "--warmup", "3", "--iterations", "1", "--json", str(out)]
    done = run_script("noise_floor.py", *argv, "--against", str(against), "--work-dir", str(tmp_path / "wd"))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    records = data["records"]
    assert [(r["source"], r["rank"]) for r in records] == [("floor", 0), ("floor", 1)]
    for record in records:
        assert set(record) == set(RECORD_TYPES) | {"phase_err"}
        assert set(record["phase_err"]) == set(PHASES)
        # Two real runs around each twin: their mean is the real side, their gap its drift.
        assert len(record["real_repeats_ms"]) == len(record["pred_repeats_ms"]) == 2
        assert record["real_bracket_drift_pct"] is not None
        assert record["pred_peak_bytes"] == record["real_peak_bytes"]  # the same program's memory
    repeats = sorted((tmp_path / "wd").glob("*/repeat*"))
    assert len(repeats) == 2
    assert all(
        (r / name / "manifest.json").is_file() for r in repeats for name in ("real", "twin", "real_after")
    )
    floor = {r["rank"]: r["iter_err_pct"] for r in records}
    assert data["beside"] == [
        {"case": label, "rank": 0, "source": "simulation", "err_pct": -3.0, "floor_err_pct": floor[0]},
        {"case": label, "rank": 1, "source": "replay", "err_pct": 2.5, "floor_err_pct": floor[1]},
    ]
    assert isinstance(data["floor_mean_abs_iter_err_pct"], float)
    assert "fidelity errors beside the floor" in done.stdout
    assert "simulation: |error| mean 3.0%, median 3.0%, max 3.0%; the floor of the same ranks" in done.stdout


def test_a_bad_case_or_fidelity_file_is_one_error_line(tmp_path: Path) -> None:
    done = run_script("noise_floor.py", "--case", "tp=1 pp=2 colour=blue")
    assert done.returncode == 2 and "error:" in done.stdout and "Traceback" not in done.stdout + done.stderr
    not_fidelity = tmp_path / "x.json"
    not_fidelity.write_text("[1, 2]")
    done = run_script("noise_floor.py", "--case", TINY, "--against", str(not_fidelity))
    assert done.returncode == 2 and "is not a fidelity JSON" in done.stdout
