"""benchmarks/fidelity.py --program: a program's graph against the program itself under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism.schemas.cluster import preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("program", "axis"),
    [
        ("examples/pp.py --pp 2 --schedule 1F1B --steps 60 --hidden 64 --seq 16", "--pp"),
        ("examples/ddp.py --steps 60 --hidden 64 --seq 16", "--dp"),  # DDP's buckets: C++ vs prism's group
    ],
    ids=["pipeline", "ddp"],
)
def test_a_program_is_compared_with_its_own_torchrun_run(tmp_path: Path, program: str, axis: str) -> None:
    spec = preset("h100-ib").save(tmp_path / "spec.toml")  # any valid spec: keeps the test from calibrating
    out = tmp_path / "fidelity.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fidelity.py"), "--program", program, axis, "2",
         "--repeats", "1", "--warmup", "9", "--iterations", "2", "--cluster-spec", str(spec), "--json", str(out)],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    by_source = {s: [r for r in result["records"] if r["source"] == s] for s in ("simulation", "replay")}
    assert [r["rank"] for r in by_source["simulation"]] == [0, 1]
    assert by_source["replay"] and {r["rank"] for r in by_source["replay"]} <= {0, 1}
    for record in result["records"]:
        assert record["real_iter_ms"] > 0 and record["pred_iter_ms"] > 0
        # Both sides measure memory the same way: what the program's tensors held when the
        # iteration began plus what the iteration allocates at its peak (to the byte, so far).
        assert abs(record["mem_err_pct"]) < 0.1, record
        # The real run, the simulation and the replay split the iteration by block alike: the
        # parts (forward, backward, optimizer, other) add up to each iteration, the simulation's
        # to its iteration exactly. A measured part (the real run's, a replay's) is the median of
        # its per-iteration values (seven clean iterations here), so the rest is never negative,
        # and the parts' medians add up to the median iteration only roughly: a stall lands in
        # one part of one iteration and moves the whole's median, not that part's, once enough
        # iterations stall (two of three did on a loaded CI host, where the parts summed to
        # 9.7 ms against a 22.5 ms median iteration).
        blocks = record["block_err"]
        assert set(blocks) == {"forward", "backward", "optimizer", "other"}
        assert blocks["forward"]["measured_ms"] > 0 and blocks["backward"]["predicted_ms"] > 0
        assert blocks["other"]["measured_ms"] >= 0
        measured = sum(p["measured_ms"] for p in blocks.values())
        assert measured == pytest.approx(record["real_iter_ms"], rel=0.5), record
        predicted = sum(p["predicted_ms"] for p in blocks.values())
        exact = record["source"] == "simulation"
        assert predicted == pytest.approx(
            record["pred_iter_ms"], **({"abs": 0.01} if exact else {"rel": 0.5})
        ), record
    for record in by_source["replay"]:  # its wall time, the corrected one beside it, its phases
        # The corrected time is the co-simulated pass (its Start to its Done, stall taken out), the
        # wall time the program's step to step: the boundaries differ by the step hook's few µs,
        # which show where the stall is near zero (a 5.8 ms iteration read 5.795 against 5.787).
        assert record["pred_corrected_ms"] <= record["pred_iter_ms"] * 1.001 + 0.05
        assert record["graph_phase_err"] and all(
            p["measured_ms"] >= 0 for p in record["graph_phase_err"].values()
        )
    assert "replay: each replayed rank's time by phase" in done.stdout
    assert "simulation: each rank's iteration by block" in done.stdout
    assert [h["rank"] for h in result["hook"]] == [0, 1]
    assert all(0 < h["hook_us"] < 10_000 and 0 < h["marks_us"] < 10_000 for h in result["hook"])
    assert "the real run's iteration-timing hook" in done.stdout


def test_a_program_that_fails_under_torchrun_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemExit('no such model')\n")
    scratch = tmp_path / "tmp"  # the run's temporary folders
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fidelity.py"), "--program", str(bad), "--dp", "2",
         "--repeats", "1", "--cluster-spec", str(preset("h100-ib").save(tmp_path / "s.toml"))],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert done.returncode == 2
    assert "the real run of" in done.stdout and "failed" in done.stdout
    # The ranks' own words, not only torchrun's report of their exit codes.
    assert "no such model" in done.stdout
    # torchrun's logs went with the run's work folder, removed with it: nothing piles up in /tmp.
    assert not list(scratch.iterdir()), list(scratch.iterdir())
