"""benchmarks/record.py keeps a command's output with the command, commit, date and machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parents[2] / "benchmarks" / "record.py"


def _record(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RECORD), "run", "--dir", str(tmp_path), "--", *command],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_result_file_holds_the_command_and_what_it_printed(tmp_path: Path) -> None:
    done = _record(tmp_path, sys.executable, "-c", "print('table row 1'); print('table row 2')")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "run.txt").read_text()
    head, body = text.split("\n\n", 1)
    assert head.startswith(f"# command: {sys.executable} -c ")
    assert {line.split(":")[0] for line in head.splitlines()} == {
        "# command",
        "# commit",
        "# date",
        "# machine",
    }
    assert body.startswith("table row 1\ntable row 2\n\n# elapsed: ")
    assert "table row 1" in done.stdout  # shown as it runs too


def test_a_failed_command_writes_nothing_and_passes_its_code_on(tmp_path: Path) -> None:
    done = _record(tmp_path, sys.executable, "-c", "import sys; print('half'); sys.exit(3)")
    assert done.returncode == 3
    assert list(tmp_path.iterdir()) == []
