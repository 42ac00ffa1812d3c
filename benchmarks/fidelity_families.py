"""Every kept fidelity record pooled by family and source: bias with its interval, median error
against the floor's, and whether each row meets the targets (``prism.fidelity.families``).

    .venv/bin/python benchmarks/fidelity_families.py [--results DIR] [--since 2026-12-01] [--markdown]
    .venv/bin/python benchmarks/fidelity_families.py --files RUN.json FLOOR.json --docs docs/fidelity.md

Reads the records of ``DIR/fidelity_*.json`` and ``DIR/noise_floor_*.json`` (``benchmarks/fidelity.py``
and ``benchmarks/noise_floor.py --json``, kept with ``benchmarks/record.py``, whose ``.txt`` header
beside each gives the date ``--since`` selects by). Each file's records are one run's: pooling
runs of several code versions mixes what each got right, so choose ``--since`` a version's date.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rich.console import Console

from prism.fidelity.families import (
    ABOVE_FLOOR_PCT,
    MAX_BIAS_PCT,
    MAX_INTERVAL_PCT,
    MIN_RECORDS,
    FamilyRow,
    family_rows,
)
from prism.schemas.terminal import Table

COLUMNS = (
    "family",
    "source",
    "records",
    "bias (95 %)",
    "median abs. error",
    "floor's median",
    "memory",
    "verdict",
)
RESULTS = Path(__file__).resolve().parent / "results"


def _header(path: Path, key: str, pattern: str) -> str:
    """The ``# key:`` field ``benchmarks/record.py`` wrote in the header beside ``path``."""
    header = path.with_suffix(".txt")
    found = re.search(rf"^# {key}: ({pattern})", header.read_text(), re.M) if header.is_file() else None
    if found is None:
        raise ValueError(f"{header}: no '# {key}:' line (keep results with benchmarks/record.py)")
    return found.group(1)


def run_date(path: Path) -> str:
    """The date (YYYY-MM-DD) ``benchmarks/record.py`` wrote beside ``path``."""
    return _header(path, "date", r"\d{4}-\d\d-\d\d")


def read_records(results: Path, since: str = "", files: list[Path] | None = None) -> tuple[list[dict], int]:
    """The records of every kept run on or after ``since`` (or of ``files`` alone), and how many
    runs they come from."""
    records, runs = [], 0
    paths = (
        files if files else sorted([*results.glob("fidelity_*.json"), *results.glob("noise_floor_*.json")])
    )
    for path in paths:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or "records" not in data or run_date(path) < since:
            continue
        records += data["records"]
        runs += 1
    return records, runs


BEGIN = "<!-- families table: make fidelity writes it -->"
END = "<!-- end of the families table -->"


def write_between_marks(path: Path, text: str) -> None:
    """Replace what ``path`` holds between its ``BEGIN`` and ``END`` lines with ``text``."""
    lines = path.read_text().splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.strip() in (BEGIN, END)]
    if len(marks) != 2 or lines[marks[0]].strip() != BEGIN:
        raise ValueError(f"{path}: needs one line {BEGIN!r} and, after it, one line {END!r}")
    start, end = marks
    path.write_text("".join(lines[: start + 1]) + text.rstrip("\n") + "\n" + "".join(lines[end:]))


def _made(files: list[Path] | None) -> str:
    """' (commit C, DATE)' of the runs given, from their record headers."""
    if not files:
        return ""
    made = {f"{_header(path, 'commit', r'.+')}, {run_date(path)}" for path in files}
    return f" ({'; '.join(sorted(made))})"


def _cells(row: FamilyRow) -> tuple[str, ...]:
    floor = "" if row.floor_median_pct is None else f"{row.floor_median_pct:.1f}%"
    bias = f"{row.bias_pct:+.1f}%" + (f" ± {row.interval_pct:.1f}" if row.records > 1 else "")
    return (
        row.family, row.source, str(row.records), bias,
        f"{row.median_abs_pct:.1f}%", floor, f"{row.max_memory_pct:.2g}%", row.verdict,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--since", default="", help="only runs made on or after this date (YYYY-MM-DD)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (for the docs)")
    parser.add_argument("--files", type=Path, nargs="+", default=None, help="these runs' JSON only")
    parser.add_argument(
        "--docs", type=Path, default=None,
        help=f"also write the Markdown table into this file, between {BEGIN!r} and {END!r}",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        records, runs = read_records(args.results, args.since, args.files)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not records:
        print(
            f"error: no fidelity records in {args.results} since {args.since or 'the first'}", file=sys.stderr
        )
        return 2
    rows = [_cells(row) for row in family_rows(records)]
    targets = (
        f"targets: |bias| <= {MAX_BIAS_PCT:g}% with its interval within ±{MAX_INTERVAL_PCT:g}% over at least "
        f"{MIN_RECORDS} records, median |error| at most {ABOVE_FLOOR_PCT:g} point over the floor's, memory exact"
    )
    markdown = "\n".join(
        ["| " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * (len(COLUMNS) - 3) + "---|"]
        + ["| " + " | ".join(row) + " |" for row in rows]
        + ["", f"{len(records)} records of {runs} runs{_made(args.files)}; {targets}."]
    )
    if args.docs is not None:
        try:
            write_between_marks(args.docs, markdown)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.markdown:
        print(markdown)
        return 0
    table = Table(
        title=f"fidelity by family: {len(records)} records of {runs} runs since {args.since or 'the first'}"
    )
    for i, column in enumerate(COLUMNS):
        table.add_column(column, justify="left" if i in (0, 1, len(COLUMNS) - 1) else "right")
    for row in rows:
        table.add_row(*row)
    console = Console(width=200)
    console.print(table)
    console.print(targets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
