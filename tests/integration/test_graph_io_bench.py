"""Smoke test of benchmarks/graph_io.py on a tiny layout: its synthetic graph follows the current
schema and validates, and every phase reports; no speed claim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "graph_io.py"


def test_the_synthetic_graph_is_written_read_and_valid() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tp", "1", "--pp", "2", "--dp", "2", "--ranks-per-row-group", "2"],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "200", "PATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "validate_graph (valid," in out
    assert "read_rank(path, r), median of 4" in out
