"""Every random-case fidelity run kept, one line a seed: the table docs/fidelity.md shows; and
with ``--bias``, where predictions are off the same way across seeds.

    .venv/bin/python benchmarks/fidelity_seeds.py [--results DIR] [--markdown]
    .venv/bin/python benchmarks/fidelity_seeds.py --bias [--since 2026-11-27] [--source simulation|final|replay]
    .venv/bin/python benchmarks/fidelity_seeds.py --used | --unused SEED

Reads ``DIR/fidelity_random*.json`` (``benchmarks/fidelity.py --random N --seed S --json``) and
the header ``benchmarks/record.py`` wrote into the ``.txt`` beside each (command, commit). Per
seed, the mean and max |iteration error| over every rank of the slice's graph, of the graph each
case ends with (``prism.fidelity.compare.final_records``: the paced one where the case was
captured paced), and of the replay's wall time; the largest |memory error|. Newest first.

``--bias`` pools the records of every run since a date by kind of rank (tp, dp, a pipeline's
first and last stage) and, for the iteration and each phase, gives the median signed error, the
median difference in ms and how many records came out short: an error that noise makes is as
often long as short, one of the method's keeps its sign from seed to seed.

``--used`` lists every seed used before (``used_seeds``); ``--unused SEED`` fails if SEED is one.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.fidelity.compare import final_records, mean_abs

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
    records: list[dict] = field(repr=False, default_factory=list)
    """Every record of the run, with its 'final' ones."""

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
    mine = [r for r in records if r["source"] == source]
    return (mean_abs(mine, "iter_err_pct"), max(abs(r["iter_err_pct"]) for r in mine)) if mine else None


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
        records=records,
    )


def rank_kind(record: dict) -> str:
    """tp, dp, or a pipeline's first or last stage (world 2: rank 0 or 1)."""
    layout = dict(item.split("=", 1) for item in record["case"].split() if "=" in item)
    if layout.get("pp", "1") != "1":
        return "pp first stage" if record["rank"] == 0 else "pp last stage"
    return "tp" if layout.get("tp", "1") != "1" else "dp"


BIAS_COLUMNS = ("ranks", "part", "records", "median error", "median ms (pred - real)", "short")


def bias_rows(runs: list[SeedRun], source: str) -> list[tuple[str, ...]]:
    """Per kind of rank, the iteration's and each phase's signed errors pooled over ``runs``."""
    pooled: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for run in runs:
        for r in (r for r in run.records if r["source"] == source):
            kind = rank_kind(r)
            pooled[(kind, "iteration")].append((r["iter_err_pct"], r["pred_iter_ms"] - r["real_iter_ms"]))
            for phase, p in (r.get("phase_err") or {}).items():
                # Without transfers there is no bubble (runs before seed 577215 gave one).
                if p.get("err_pct") is not None and (phase != "bubble" or kind.startswith("pp")):
                    pooled[(kind, phase)].append((p["err_pct"], p["predicted_ms"] - p["measured_ms"]))
    rows = []
    for (kind, part), values in sorted(
        pooled.items(), key=lambda kv: (kv[0][0], kv[0][1] != "iteration", kv[0][1])
    ):
        errors, deltas = [e for e, _ in values], [d for _, d in values]
        short = sum(e < 0 for e in errors)
        rows.append((kind, part, str(len(values)), f"{statistics.median(errors):+.1f}%", f"{statistics.median(deltas):+.2f}", f"{short}/{len(values)}"))  # fmt: skip
    return rows


SEED_MENTION = re.compile(r"(?:[Ss]eeds? |--seed )(\d{2,})")
"""How the results log names a seed whose run's files are no longer kept."""


def used_seeds(results: Path) -> list[int]:
    """Every seed a kept random run, its noise floor, a calibrated spec folder or the results log
    names, sorted: a seed chosen outside them has cases the model was not developed on."""
    log = results / "fidelity-log.md"
    seeds = {int(n) for n in SEED_MENTION.findall(log.read_text())} if log.is_file() else set()
    for path in [*results.glob("fidelity_*.json"), *results.glob("noise_floor_*.json")]:
        cases = json.loads(path.read_text()).get("meta", {}).get("cases")
        if isinstance(cases, dict) and isinstance(cases.get("seed"), int):
            seeds.add(cases["seed"])
    specs = results / "fidelity-specs"
    seeds |= {int(p.name) for p in specs.iterdir() if p.name.isdigit()} if specs.is_dir() else set()
    return sorted(seeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (for the docs)")
    parser.add_argument("--bias", action="store_true", help="signed errors by kind of rank and phase, pooled")
    parser.add_argument(
        "--since", default="", help="--bias: only runs made on or after this date (YYYY-MM-DD)"
    )
    parser.add_argument("--used", action="store_true", help="print every seed used before, one line")
    parser.add_argument(
        "--unused", type=int, default=None, metavar="SEED", help="exit 2 if SEED was used before"
    )
    parser.add_argument("--source", choices=("simulation", "final", "replay"), default="simulation")
    args = parser.parse_args(argv)
    if args.used or args.unused is not None:
        used = used_seeds(args.results)
        if args.unused is None:
            print(", ".join(map(str, used)))
            return 0
        if args.unused in used:
            print(
                f"error: seed {args.unused} was used before; choose one not in {', '.join(map(str, used))}",
                file=sys.stderr,
            )
            return 2
        return 0
    try:
        runs = [read_seed_run(p) for p in args.results.glob("fidelity_random*.json")]
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs.sort(key=lambda r: r.stamp, reverse=True)
    if args.bias:
        chosen = [r for r in runs if r.stamp[:10] >= args.since]
        title = f"'{args.source}' against real over {len(chosen)} seeds since {args.since or 'the first'}"
        show(title, BIAS_COLUMNS, 2, bias_rows(chosen, args.source), markdown=args.markdown)
        return 0
    title = "random-case fidelity runs, mean (max) |iteration error| over every rank, %"
    show(title, COLUMNS, 4, [run.row() for run in runs], markdown=args.markdown)
    return 0


def show(
    title: str, columns: tuple[str, ...], left: int, rows: list[tuple[str, ...]], *, markdown: bool
) -> None:
    """Print ``rows`` as a rich table, or as Markdown (the first ``left`` columns text, the rest numbers)."""
    if markdown:
        print("| " + " | ".join(columns) + " |")
        print("|" + "---|" * left + "---:|" * (len(columns) - left))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i < left else "right")
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    raise SystemExit(main())
