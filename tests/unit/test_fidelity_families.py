"""Fidelity by family: what a record emulates, and each pool judged by its bias and its floor."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from prism.fidelity.families import MIN_RECORDS, family_of, family_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fidelity_families  # noqa: E402

GPT_DP = "tp=1 pp=1 dp=2 layers=2 hidden=64 heads=2 seq=32 mbs=1 microbatches=2"


def record(
    case: str, error: float, *, rank: int = 0, source: str = "simulation", memory: float = 0.0
) -> dict:
    return {"case": case, "rank": rank, "source": source, "iter_err_pct": error, "mem_err_pct": memory}


@pytest.mark.parametrize(
    ("case", "rank", "family"),
    [
        (GPT_DP, 1, "GPT dp"),
        ("tp=2 pp=1 dp=1 layers=2", 0, "GPT tp"),
        ("tp=1 pp=2 dp=1 layers=4", 0, "GPT pp first stage"),
        ("tp=1 pp=2 dp=1 layers=4", 1, "GPT pp last stage"),
        ("tp=2 pp=2 dp=1 layers=4", 3, "GPT mixed"),
        ("examples/ddp.py --steps 40 (tp=1 pp=1 dp=2)", 0, "examples/ddp.py dp=2"),
        ("examples/cp.py --cp 2 (tp=1 pp=1 dp=1 cp=2)", 1, "examples/cp.py cp=2"),
        ("-m torchtitan.train --module llama3 --config x (tp=1 pp=2 dp=1)", 0, "torchtitan llama3 pp=2"),
        (
            "examples/fsdp2.py --layers 10 built at 10 layers from examples/fsdp2.py --layers 5 (tp=1 pp=1 dp=2)",
            0,
            "examples/fsdp2.py dp=2 built from fewer layers",
        ),
    ],
)
def test_a_record_belongs_to_what_it_emulates(case: str, rank: int, family: str) -> None:
    assert family_of(record(case, 0.0, rank=rank)) == family


def test_a_family_meets_the_targets_only_unbiased_resolved_and_near_its_floor() -> None:
    draw = random.Random(7)
    fair = [record(GPT_DP, draw.gauss(0.0, 3.0)) for _ in range(200)]
    floor = [record(GPT_DP, draw.gauss(0.0, 3.0), source="floor") for _ in range(50)]
    (row,) = family_rows(fair + floor)
    assert (row.family, row.source, row.records) == ("GPT dp", "simulation", 200)
    assert abs(row.bias_pct) < row.interval_pct < 1.0  # noise: the interval holds zero
    assert row.verdict == "meets" and not row.biased
    # The same noise 6 % short: a bias beyond its interval, and errors beyond the floor's.
    short = [{**r, "iter_err_pct": r["iter_err_pct"] - 6.0} for r in fair]
    (row,) = family_rows(short + floor)
    assert row.biased and row.verdict.startswith("bias -6.")
    assert "over floor" in row.verdict


def test_what_a_row_lacks_is_said() -> None:
    few = [record(GPT_DP, 0.1 * i, source="replay") for i in range(MIN_RECORDS - 1)]
    (row,) = family_rows(few)
    assert row.verdict == f"{MIN_RECORDS - 1} of {MIN_RECORDS} records"
    enough = [*few, record(GPT_DP, 0.0, source="replay", memory=0.5)]
    (row,) = family_rows(enough)
    assert row.floor_median_pct is None and "no floor" in row.verdict and "memory 0.5%" in row.verdict


def _kept(results: Path, name: str, records: list[dict], date: str) -> None:
    (results / f"{name}.json").write_text(json.dumps({"records": records}))
    (results / f"{name}.txt").write_text(f"# command: x\n# commit: abc\n# date: {date}T10:00:00+00:00\n")


def test_the_benchmark_pools_kept_runs_since_a_date(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _kept(tmp_path, "fidelity_old", [record(GPT_DP, -9.0)], "2026-11-01")
    _kept(tmp_path, "fidelity_new", [record(GPT_DP, 1.0), record(GPT_DP, 3.0)], "2026-12-01")
    _kept(tmp_path, "noise_floor_new", [record(GPT_DP, 2.0, source="floor")], "2026-12-01")
    assert fidelity_families.main(["--results", str(tmp_path), "--since", "2026-12-01", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert "| GPT dp | simulation | 2 | +2.0% ± 2.0 | 2.0% | 2.0% | 0% | 2 of 40 records |" in table
    assert "3 records of 2 runs" in table
    (tmp_path / "fidelity_new.txt").write_text("no header\n")
    assert fidelity_families.main(["--results", str(tmp_path)]) == 2
    assert "no '# date:' line" in capsys.readouterr().err


def test_the_protocols_runs_alone_are_written_between_the_docs_marks(tmp_path: Path, capsys) -> None:
    _kept(tmp_path, "fidelity_other", [record(GPT_DP, -9.0)], "2026-12-01")
    _kept(tmp_path, "fidelity_protocol", [record(GPT_DP, 1.0), record(GPT_DP, 3.0)], "2026-12-03")
    _kept(tmp_path, "noise_floor_protocol", [record(GPT_DP, 2.0, source="floor")], "2026-12-03")
    docs = tmp_path / "fidelity.md"
    docs.write_text(
        f"# Fidelity\n\nbefore\n{fidelity_families.BEGIN}\nold table\n{fidelity_families.END}\nafter\n"
    )
    files = [str(tmp_path / f"{name}.json") for name in ("fidelity_protocol", "noise_floor_protocol")]
    assert fidelity_families.main(["--files", *files, "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert text.startswith("# Fidelity\n\nbefore\n" + fidelity_families.BEGIN + "\n| family |")
    assert text.endswith(fidelity_families.END + "\nafter\n") and "old table" not in text
    assert "| GPT dp | simulation | 2 | +2.0% ± 2.0 |" in text  # the other run's -9 % is not pooled
    assert "3 records of 2 runs (" in text and "2026-12-03" in text
    docs.write_text("no marks\n")
    assert fidelity_families.main(["--files", *files, "--docs", str(docs)]) == 2
    assert "needs one line" in capsys.readouterr().err
