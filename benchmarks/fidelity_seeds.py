"""Every random-case fidelity run kept, one line a seed: the table docs/fidelity.md shows.

    .venv/bin/python benchmarks/fidelity_seeds.py [--results DIR] [--markdown]

Reads ``DIR/fidelity_random*.json`` (``benchmarks/fidelity.py --random N --seed S --json``) and
the header ``benchmarks/record.py`` wrote into the ``.txt`` beside each (command, commit). Per
seed, the mean and max |iteration error| over every rank of the slice's graph, of the graph each
case ends with (``prism.fidelity.compare.final_records``: the paced one where the case was
captured paced), and of the replay's wall time; the largest |memory error|. Newest first.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.fidelity.compare import final_records

COLUMNS = ("seed", "date", "commit", "repeats, pricing", "slice graph (max)", "final graph (max)", "replay, wall (max)", "memory")  # fmt: skip


@dataclass(frozen=True)
class SeedRun:
    seed: str
    stamp: str
    """When the run ended (ISO 8601)."""
    commit: str
    how: str
    errors: dict[str, tuple[float, float] | None]
    """Per source ('simulation', 'final', 'replay'): (mean, max) |iteration error|, %."""
    memory_pct: float

    def row(self) -> tuple[str, ...]:
        def cell(source: str) -> str:
            pair = self.errors[source]
            return "-" if pair is None else f"{pair[0]:.1f} ({pair[1]:.1f})"

        final = cell("final") if self.errors["final"] is not None else "="
        return (self.seed, self.stamp[:10], self.commit, self.how, cell("simulation"), final, cell("replay"), f"{self.memory_pct:.3f}")  # fmt: skip


def _header(text: str, key: str) -> str:
    found = re.search(rf"^# {key}: (.*)$", text, re.M)
    if found is None:
        raise ValueError(f"no '# {key}:' line: not a result benchmarks/record.py wrote")
    return found.group(1).strip()


def _pricing(command: str) -> str:
    if "--recalibrate-each" in command:
        return "a calibration before each case"
    if "--recalibrate" in command:
        return "one fresh calibration"
    given = re.search(r"--cluster-spec (\S+)", command)
    return f"spec {Path(given.group(1)).name}" if given else "the local preset"


def _pacing(command: str) -> str:
    paced = re.search(r"--paced(?: (all|pipelines))?(?:\s|$)", command)
    if paced is None:
        return ""
    return ", pipelines paced" if paced.group(1) == "pipelines" else ", every case paced"


def _errors(records: list[dict], source: str) -> tuple[float, float] | None:
    values = [abs(r["iter_err_pct"]) for r in records if r["source"] == source]
    return (sum(values) / len(values), max(values)) if values else None


def read_seed_run(path: Path) -> SeedRun:
    """One run from its JSON and the record header of the ``.txt`` beside it."""
    data = json.loads(path.read_text())
    header = path.with_suffix(".txt").read_text()
    try:
        command = _header(header, "command")
    except ValueError as e:
        raise ValueError(f"{path.with_suffix('.txt')}: {e}") from None
    seed = re.search(r"--seed (\d+)", command)
    if seed is None:
        raise ValueError(f"{path}: its command has no --seed")
    records = data["records"] + final_records(data["records"])
    return SeedRun(
        seed=seed.group(1),
        stamp=data["meta"]["machine"]["date"],
        commit=_header(header, "commit").split()[0],
        how=f"{data['meta']['repeats']}{_pacing(command)}, {_pricing(command)}",
        errors={source: _errors(records, source) for source in ("simulation", "final", "replay")},
        memory_pct=max(abs(r["mem_err_pct"]) for r in data["records"]),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (for the docs)")
    args = parser.parse_args(argv)
    try:
        runs = [read_seed_run(p) for p in args.results.glob("fidelity_random*.json")]
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs.sort(key=lambda r: r.stamp, reverse=True)
    if args.markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "---|" * 4 + "---:|" * (len(COLUMNS) - 4))
        for run in runs:
            print("| " + " | ".join(run.row()) + " |")
        return 0
    table = Table(title="random-case fidelity runs, mean (max) |iteration error| over every rank, %")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in COLUMNS[:4] else "right")
    for run in runs:
        table.add_row(*run.row())
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
