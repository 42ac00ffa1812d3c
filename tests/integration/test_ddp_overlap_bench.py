"""Smoke test of benchmarks/ddp_overlap.py: the three ways run, every rank's steps are counted,
and the blocks of a step add up; no speed claim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ddp_overlap.py"


def test_each_way_reports_its_steps_by_block() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "30", "--repeats", "1", "--hidden", "32", "--vocab", "64", "--seq", "8"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 6 and cells[0] and cells[0] != "way":
            rows[cells[0]] = cells
    assert list(rows) == ["one process alone", "two processes, no communication", "two ranks, DDP over gloo"]
    # 30 steps, the first 20 left out: 10 a rank.
    assert [int(r[5]) for r in rows.values()] == [10, 20, 20]
    for cells in rows.values():
        quantiles = [[float(v) for v in re.findall(r"[\d.]+", cell)] for cell in cells[1:5]]
        assert all(len(q) == 3 and 0 < q[0] <= q[1] <= q[2] for q in quantiles), cells
        # Each block's median is part of the step's: the step's is at least the largest of them.
        assert max(q[1] for q in quantiles[:3]) <= quantiles[3][1]


def test_too_few_steps_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "20"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "--steps must be more than" in done.stderr
