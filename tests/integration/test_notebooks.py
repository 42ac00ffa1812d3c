"""Every notebook in notebooks/ runs top to bottom on its small sample and draws its figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (ROOT / "notebooks").glob("*.py") if p.name != "execute.py")

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_draws(notebook: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"  # the kernel's temporary folders
    scratch.mkdir()
    done = subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "execute.py"), "--figures", str(tmp_path), str(notebook)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    # Its captures and graphs go once the kernel exits: run after run, nothing piles up.
    assert not list(scratch.glob("prism-*")), list(scratch.iterdir())
    figures = list(tmp_path.glob("*.png"))
    assert figures and all(f.stat().st_size > 10_000 for f in figures)
    # The figure the README shows is the one this notebook draws.
    for figure in figures:
        assert (ROOT / "docs" / "figures" / figure.name).is_file(), f"{figure.name} is not in docs/figures"
