"""benchmarks/fidelity_seeds.py: one line a kept random-case run, the final graph's errors beside the slice's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity_seeds.py"


def _run(results: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(results), *(options or ("--markdown",))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _record(case: str, rank: int, source: str, err: float, mem: float = 0.0) -> dict:
    return {"case": case, "rank": rank, "source": source, "iter_err_pct": err, "mem_err_pct": mem}


def _keep(results: Path, name: str, command: str, date: str, records: list[dict]) -> None:
    meta = {"repeats": 3, "machine": {"date": date}}
    (results / f"{name}.json").write_text(json.dumps({"records": records, "meta": meta}))
    header = f"# command: {command}\n# commit: abc1234 (with uncommitted changes)\n# date: {date}\n# machine: x\n\n"
    (results / f"{name}.txt").write_text(header + "tables\n")


def test_each_seed_is_a_row_newest_first_with_its_final_graph(tmp_path: Path) -> None:
    base = "python benchmarks/fidelity.py --random 10 --repeats 3"
    _keep(tmp_path, "fidelity_random_11", f"{base} --seed 11 --recalibrate", "2026-11-01T10:00:00+00:00", [
        _record("tp", 0, "simulation", -4.0), _record("tp", 0, "replay", 2.0, 0.05),
    ])  # fmt: skip
    _keep(tmp_path, "fidelity_random_22", f"{base} --seed 22 --paced pipelines --cluster-spec s/spec.toml", "2026-11-02T10:00:00+00:00", [
        _record("tp", 0, "simulation", -2.0),
        _record("pp", 0, "simulation", -12.0),
        _record("pp", 0, "paced", 4.0),
        _record("pp", 0, "replay", 1.0),
    ])  # fmt: skip
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines()[2:]]
    assert [r[0] for r in rows] == ["| 22", "| 11"]
    newer, older = rows
    # The final graph: the tp case from its slice (-2 %), the pipeline paced (+4 %).
    assert newer[1:7] == ["2026-11-02", "abc1234", "3, pipelines paced, spec spec.toml", "7.0 (12.0)", "3.0 (4.0)", "1.0 (1.0)"]  # fmt: skip
    # Nothing paced: the final graph is the slice's.
    assert older[3:7] == ["3, one fresh calibration", "4.0 (4.0)", "=", "2.0 (2.0)"]
    assert older[7] == "0.050 |"


def test_a_result_without_its_record_header_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "fidelity_random_1.json").write_text(json.dumps({"records": [], "meta": {}}))
    (tmp_path / "fidelity_random_1.txt").write_text("just tables\n")
    done = _run(tmp_path)
    assert (
        done.returncode == 2 and done.stderr.startswith("error: ") and "benchmarks/record.py" in done.stderr
    )
    assert "Traceback" not in done.stderr


def test_bias_pools_signed_errors_by_kind_of_rank_and_phase(tmp_path: Path) -> None:
    def phased(case: str, rank: int, err: float, backward: tuple[float, float]) -> dict:
        real, pred = backward
        phases = {"backward": {"measured_ms": real, "predicted_ms": pred, "err_pct": (pred - real) / real * 100},
                  "bubble": {"measured_ms": 0.5, "predicted_ms": 0.0, "err_pct": -100.0}}  # fmt: skip
        return {**_record(case, rank, "simulation", err), "real_iter_ms": 100.0, "pred_iter_ms": 100.0 + err, "phase_err": phases}  # fmt: skip

    base = "python benchmarks/fidelity.py --random 10 --repeats 3"
    pp, dp = "tp=1 pp=2 dp=1 layers=2", "tp=1 pp=1 dp=2 layers=2"
    _keep(tmp_path, "fidelity_random_1", f"{base} --seed 1", "2026-10-01T10:00:00+00:00", [phased(pp, 0, 50.0, (10, 20))])  # fmt: skip
    _keep(tmp_path, "fidelity_random_2", f"{base} --seed 2", "2026-11-02T10:00:00+00:00", [
        phased(pp, 0, -6.0, (10, 9)), phased(pp, 1, 2.0, (10, 10.5)), phased(dp, 0, -3.0, (10, 9.5)),
    ])  # fmt: skip
    _keep(tmp_path, "fidelity_random_3", f"{base} --seed 3", "2026-11-03T10:00:00+00:00", [
        phased(pp, 0, -4.0, (10, 8)), phased(dp, 0, 1.0, (10, 10)),
    ])  # fmt: skip
    done = _run(tmp_path, "--bias", "--since", "2026-11-01", "--markdown")
    assert done.returncode == 0, done.stderr
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in done.stdout.splitlines()[2:]]
    rows = {tuple(c[:2]): c[2:] for c in cells}
    # Seed 1 is before --since; the first stage of two runs: -6 and -4 % (median -5), both short.
    assert rows[("pp first stage", "iteration")] == ["2", "-5.0%", "-5.00", "2/2"]
    assert rows[("pp first stage", "backward")] == ["2", "-15.0%", "-1.50", "2/2"]
    assert rows[("pp last stage", "iteration")] == ["1", "+2.0%", "+2.00", "0/1"]
    assert rows[("dp", "iteration")] == ["2", "-1.0%", "-1.00", "1/2"]
    # A pipeline has a bubble to get wrong; ranks without transfers do not.
    assert ("pp first stage", "bubble") in rows and ("dp", "bubble") not in rows


def test_the_seeds_used_before_are_listed_and_refused(tmp_path: Path) -> None:
    _keep(tmp_path, "fidelity_random_77", "fidelity.py --random 2 --seed 77", "2026-12-01", [])
    data = json.loads((tmp_path / "fidelity_random_77.json").read_text())
    data["meta"]["cases"] = {"random": 2, "seed": 77}
    (tmp_path / "fidelity_random_77.json").write_text(json.dumps(data))
    (tmp_path / "fidelity-specs" / "4242").mkdir(parents=True)
    (tmp_path / "fidelity-log.md").write_text("Seed 31's cases, then `--seed 515` and seeds 8128.\n")
    listed = _run(tmp_path, "--used")
    assert listed.returncode == 0 and listed.stdout.strip() == "31, 77, 515, 4242, 8128"
    refused = _run(tmp_path, "--unused", "515")
    assert refused.returncode == 2 and "seed 515 was used before" in refused.stderr
    assert _run(tmp_path, "--unused", "20261203").returncode == 0
