"""Where a kept fidelity run's replays wait: each iteration's first call, real run against replay.

    .venv/bin/python benchmarks/fidelity_first_call.py WORK_DIR [--case SUBSTRING]

For every repeat of a run kept with ``benchmarks/fidelity.py --work-dir WORK_DIR`` and every
replayed rank: how long the first process-group call of each clean iteration took (enter to
completion, median over the clean unprofiled iterations) in the real runs beside the replay and
in the replay, next to the optimizer step's time (``optim`` phase) as the replay measured it and
as the graph predicts it. A virtual peer that leaves the previous iteration late — its graph's
optimizer step longer than the real one — keeps the replayed rank waiting in that call, where
the real ranks, finishing their steps together, hardly wait.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

from prism.graph.profiler_overhead import clean_unprofiled
from prism.schemas.comm_log import CommCall, read_comm_log
from prism.schemas.replay import ReplayReport

REAL_RUNS = ("real", "real_after")
COLUMNS = ("case", "repeat", "rank", "real", "replay", "optim replay", "optim graph", "replay − graph")


class FirstCall(NamedTuple):
    """One replayed rank of one repeat (times in ms)."""

    case: str
    repeat: str
    rank: int
    real_ms: float | None
    """First call in the real runs beside the replay (median of theirs)."""
    replay_ms: float
    optim_measured_ms: float | None
    """The replayed rank's optimizer step."""
    optim_predicted_ms: float | None
    """The graph's optimizer step of that rank (what its virtual peers run)."""
    excess_ms: float
    """The replay's iteration less the graph's prediction."""


def first_call_ms(comm_log: Path, iterations: int, warmup: int) -> float:
    """Median time from enter to completion of each clean iteration's first call."""
    calls = read_comm_log(comm_log).calls
    per_iteration, rest = divmod(len(calls), iterations)
    if rest:
        raise ValueError(f"{comm_log}: {len(calls)} calls do not split into {iterations} iterations")
    firsts: list[CommCall] = [calls[i * per_iteration] for i in range(iterations)]
    return statistics.median(
        (max(c.done_ns, c.exit_ns) - c.enter_ns) / 1e6 for c in clean_unprofiled(firsts, warmup)
    )


def rows(work_dir: Path, case_filter: str = "") -> list[FirstCall]:
    """One row per (case, repeat, replayed rank)."""
    out = []
    for case in sorted(p for p in work_dir.iterdir() if p.is_dir() and case_filter in p.name):
        for repeat in sorted(case.glob("repeat*")):
            report_file = repeat / "replay" / "report.json"
            if not report_file.exists():
                continue
            report = ReplayReport.from_dict(json.loads(report_file.read_text()))
            iterations = report.warmup + report.iterations
            for rank in report.ranks:
                phases = {p.phase: p for p in rank.phases}
                real = [
                    first_call_ms(
                        repeat / run / "comm" / f"rank{rank.rank}.comm.json", iterations, report.warmup
                    )
                    for run in REAL_RUNS
                    if (repeat / run / "comm" / f"rank{rank.rank}.comm.json").exists()
                ]
                replay = first_call_ms(
                    repeat / "replay" / "comm" / f"rank{rank.rank}.comm.json", iterations, report.warmup
                )
                optim = phases.get("optim")
                out.append(
                    FirstCall(
                        case=case.name, repeat=repeat.name, rank=rank.rank,
                        real_ms=statistics.median(real) if real else None, replay_ms=replay,
                        optim_measured_ms=optim.measured_ms if optim else None,
                        optim_predicted_ms=optim.predicted_ms if optim else None,
                        excess_ms=rank.measured_iter_ms - rank.predicted_iter_ms,
                    )
                )  # fmt: skip
    return out


def short_case(folder: str) -> str:
    """'tp2_pp1_dp1_layers4_hidden128_...' -> 'tp2 pp1 dp1 hidden128'."""
    keep = ("tp", "pp", "dp", "hidden")
    return " ".join(part for part in folder.split("_") if part.startswith(keep))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path, help="the fidelity run's --work-dir")
    parser.add_argument("--case", default="", help="only case folders whose name contains this")
    args = parser.parse_args(argv)
    if not args.work_dir.is_dir():
        print(f"error: {args.work_dir} is not a directory", file=sys.stderr)
        return 2
    try:
        found = rows(args.work_dir, args.case)
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not found:
        print(f"error: no replays under {args.work_dir}", file=sys.stderr)
        return 2
    table = Table(title=f"each iteration's first call, ms (median of clean iterations) — {args.work_dir}")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column == "case" else "right")

    def ms(value: float | None) -> str:
        return "" if value is None else f"{value:.1f}"

    for row in found:
        table.add_row(
            short_case(row.case), row.repeat, str(row.rank), ms(row.real_ms), ms(row.replay_ms),
            ms(row.optim_measured_ms), ms(row.optim_predicted_ms), ms(row.excess_ms),
        )  # fmt: skip
    Console(width=max(120, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
