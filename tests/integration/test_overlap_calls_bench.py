"""benchmarks/overlap_calls.py: a short real run prints and writes every size; no speed claim.
Its method, ``prism.graph.comm.bench.run_busy_benchmark``, and the summary of its rounds are
tested with the calibration (tests/integration/test_calibrate.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "overlap_calls.py"


def test_a_short_run_reports_every_size(tmp_path) -> None:
    out = tmp_path / "summary.json"
    args = [
        "--sizes",
        "4096",
        "65536",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--span-ms",
        "4",
        "--json",
        str(out),
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "members computing" in done.stdout
    summary = json.loads(out.read_text())
    assert [s["bytes"] for s in summary] == [4096, 65536]
    for s in summary:
        assert 0 < s["idle_s"] and 0 < s["busy_s"] and s["factor"] == s["busy_s"] / s["idle_s"]
        assert 0 < s["compute_rate"] < 3 and s["rounds"] == 2
