"""Noise floor of the fidelity benchmark: every rank real against every rank real (A/A).

    .venv/bin/python benchmarks/noise_floor.py --random 10 --seed S --repeats 5 --warmup 12 \\
        [--against benchmarks/results/fidelity_random_S.json] [--json out.json]
    .venv/bin/python benchmarks/noise_floor.py --program "examples/ddp.py --steps 40" --dp 2 --repeats 8 --warmup 12

Runs the cases benchmarks/fidelity.py would run (the same --case / --random / --program options),
each repeat measuring every rank for real where the fidelity run does and once more where it
replays (``prism.fidelity.noise_floor``). The twin run's errors are what a prediction exactly
as good as the real program would score under the same repeats on this machine: the floor the
fidelity records' errors stand on. With --against, each record of a fidelity JSON of the same
cases is shown beside its floor. See docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.fidelity import (
    CaseError,
    RunSettings,
    mean_errors,
    parse_case,
)
from prism.fidelity.compare import steal_line
from prism.fidelity.noise_floor import FLOOR, beside_floor, case_floor, program_floor
from prism.fidelity.options import (
    add_case_options,
    case_texts,
    check_case_options,
    measuring_settings,
    program_cases,
)
from prism.fidelity.program_case import ProgramRunFailed
from prism.fidelity.report import case_ids, legend_table, machine, phase_table, records_table, summary_table
from prism.schemas.files import write_json_atomic
from prism.schemas.layout import LayoutError

console = Console(width=max(120, Console().width))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_options(parser)
    parser.add_argument(
        "--no-bracket", action="store_true",
        help="cases of the built-in model: one real run then the twin, as benchmarks/fidelity.py "
        "--no-bracket measures (default: real, twin, real, the twin against the mean of the two)",
    )  # fmt: skip
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="a fidelity JSON of the same cases: its errors beside the floor",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the runs here")
    args = parser.parse_args(argv)
    check_case_options(parser, args)
    if args.against is not None and not args.against.is_file():
        parser.error(f"--against: {args.against} is not a file")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    against = None
    if args.against is not None:
        try:
            against = json.loads(args.against.read_text())["records"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            console.print(f"[bold red]error:[/] {args.against} is not a fidelity JSON: {e}", highlight=False)
            return 2
    settings = RunSettings(
        warmup=args.warmup,
        iterations=args.iterations,
        work_dir=args.work_dir,
        bracket=not args.no_bracket,
        **measuring_settings(args),
    )
    try:
        records = _measure(args, settings)
    except (CaseError, LayoutError, ProgramRunFailed) as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    ids = case_ids(records)
    key = "block_err" if args.program else "phase_err"
    tables: list[Table] = [
        legend_table(ids),
        records_table(records, ids, FLOOR),
        phase_table(records, ids, FLOOR, key),
        summary_table(records, ids),
    ]
    rows = beside_floor(against, records) if against is not None else []
    if rows:
        tables += [beside_table(rows, ids)]
    for table in tables:
        console.print(table)
    for line in beside_summary(rows):
        console.print(line, highlight=False)
    console.print(steal_line(records), highlight=False)
    elapsed = time.perf_counter() - started
    console.print(f"took {elapsed:.0f} s", highlight=False)
    if args.json:
        command = ["python", "benchmarks/noise_floor.py", *(sys.argv[1:] if argv is None else argv)]
        write_json_atomic(
            args.json,
            {
                "records": records,
                **mean_errors(records),
                "beside": rows,
                "meta": {
                    "command": shlex.join(command),
                    "cases": {"random": args.random, "seed": args.seed}
                    if args.random
                    else "given, fixed or programs",
                    "repeats": args.repeats,
                    "warmup": args.warmup,
                    "iterations": args.iterations,
                    "bracket": settings.bracket and not args.program,
                    "elapsed_s": round(elapsed, 1),
                    "machine": machine(),
                },  # fmt: skip
            },
        )
        console.print(f"wrote {args.json}")
    return 0


def _measure(args: argparse.Namespace, settings: RunSettings) -> list[dict]:
    if args.program:
        cases = program_cases(args)
        return [r for case in cases for r in program_floor(case, args.repeats, settings, progress=_log)]
    configs = [parse_case(text) for text in case_texts(args)]
    return [r for config in configs for r in case_floor(config, args.repeats, settings, progress=_log)]


def beside_table(rows: list[dict], ids: dict[str, str]) -> Table:
    """Each fidelity error beside its case's floor."""
    table = Table(
        title="fidelity errors beside the floor (the same case and rank, real against its twin run)"
    )
    for column in ("case", "rank", "source", "error", "floor"):
        table.add_column(column, justify="left" if column in ("case", "source") else "right")
    for r in rows:
        table.add_row(
            ids[r["case"]],
            str(r["rank"]),
            r["source"],
            f"{r['err_pct']:+.1f}%",
            f"{r['floor_err_pct']:+.1f}%",
        )
    table.caption = "floor: measured at another time than the fidelity run, on the same machine"
    return table


def beside_summary(rows: list[dict]) -> list[str]:
    """Per source, the mean, median and max |error| beside the same of the floor, over the same ranks."""
    lines = []
    for source in dict.fromkeys(r["source"] for r in rows):
        chosen = [r for r in rows if r["source"] == source]
        lines.append(
            f"{source}: |error| {_spread(chosen, 'err_pct')}; the floor of the same ranks: "
            f"{_spread(chosen, 'floor_err_pct')}; {sum(abs(r['err_pct']) <= abs(r['floor_err_pct']) for r in chosen)} "
            f"of {len(chosen)} errors at most their floor's"
        )
    return lines


def _spread(rows: list[dict], key: str) -> str:
    values = [abs(r[key]) for r in rows]
    return f"mean {statistics.mean(values):.1f}%, median {statistics.median(values):.1f}%, max {max(values):.1f}%"


def _log(message: str) -> None:
    console.log(message, markup=False, highlight=False)


if __name__ == "__main__":
    sys.exit(main())
