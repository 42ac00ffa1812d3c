"""benchmarks/overlap_calls.py: its summary of synthetic rounds, and a short real run; no speed claim."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "overlap_calls.py"


def _module():
    spec = importlib.util.spec_from_file_location("overlap_calls", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_latency_runs_from_the_later_issue_and_the_rate_is_against_no_call() -> None:
    ms = 1_000_000
    # (round, bytes, way, issue_ns, done_ns, matmuls in flight, ns in flight) per member.
    member0 = [
        (0, 64, "idle", 0, 3 * ms, 0, 0),
        (0, 64, "computing", 10 * ms, 20 * ms, 80, 10 * ms),
        (0, 64, "no call", 30 * ms, 50 * ms, 200, 20 * ms),
    ]
    member1 = [
        (0, 64, "idle", 1 * ms, 2 * ms, 0, 0),
        (0, 64, "computing", 12 * ms, 18 * ms, 60, 6 * ms),
        (0, 64, "no call", 30 * ms, 50 * ms, 200, 20 * ms),
    ]
    s = _module()._summarise([member0, member1])[64]
    assert s["idle_mean_ms"] == pytest.approx(1.5)  # exits 3 and 2 ms, the later issue at 1 ms
    assert s["computing_mean_ms"] == pytest.approx(7.0)  # (20 - 12 + 18 - 12) / 2
    assert s["compute_rate_in_flight"] == pytest.approx(0.9)  # 8 and 10 a ms in flight, 10 a ms alone


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
    summary = json.loads(out.read_text())
    assert set(summary) == {"4096", "65536"}
    for s in summary.values():
        assert 0 < s["idle_mean_ms"] and 0 < s["computing_mean_ms"]
        assert 0 < s["compute_rate_in_flight"] < 3
