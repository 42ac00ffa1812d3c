"""Where a kept fidelity run's replays wait: each iteration's first call, real run against replay.

    .venv/bin/python benchmarks/fidelity_first_call.py WORK_DIR [--case SUBSTRING]

For every repeat of a run kept with ``benchmarks/fidelity.py --work-dir WORK_DIR`` and every
replayed rank: how long the first process-group call of each clean iteration took (enter to
completion, median over the clean unprofiled iterations) in the real runs beside the replay and
in the replay, next to the optimizer step's time (``optim`` phase) as the replay measured it and
as the graph predicts it. A virtual peer that leaves the previous iteration late — its graph's
optimizer step longer than the real one — keeps the replayed rank waiting in that call, where
the real ranks, finishing their steps together, hardly wait.

The last column is what a per-op profiler correction would make of the step: the capture the
graph was built from gives one cost per profiled op, ``c = (profiled − unprofiled own
iteration) / profiled ops per iteration``, and the step's profiled time less ``c`` per op in it
(the build's one factor per role is the ``optim graph`` column).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
from fidelity_lib import PACED_GRAPH
from rich.console import Console
from rich.table import Table

from prism.graph.kineto import CPU_OP, USER_ANNOTATION, read_kineto
from prism.graph.profiler_overhead import clean_unprofiled
from prism.schemas.comm_log import CommCall, read_comm_log
from prism.schemas.manifest import CaptureFiles, read_manifest
from prism.schemas.replay import ReplayReport

REAL_RUNS = ("real", "real_after")
COLUMNS = (
    "case", "repeat", "rank", "real", "replay", "replay − graph", "optim replay", "optim graph", "optim per-op",
)  # fmt: skip


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
    optim_per_op_ms: float | None
    """The step with a per-op profiler correction (module docstring)."""


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


def optim_per_op_ms(capture: Path, rank: int) -> float | None:
    """The rank's optimizer step in ``capture`` less one profiler cost per op (module docstring)."""
    manifest = read_manifest(capture)
    result = next(r for r in manifest.ranks if r.rank == rank)
    own, warmup = result.result.own_iteration_ns, manifest.job.warmup
    spans = read_kineto(capture / result.kineto).spans
    ops = np.sort(spans.loc[spans["cat"] == CPU_OP, "start_ns"].to_numpy())
    marks = spans[spans["cat"] == USER_ANNOTATION]

    def within(prefix: str) -> list[tuple[int, int]]:
        picked = marks[marks["name"].str.startswith(prefix)]
        return list(zip(picked["start_ns"], picked["end_ns"], strict=True))

    def ops_in(span: tuple[int, int]) -> int:
        return int(np.searchsorted(ops, span[1]) - np.searchsorted(ops, span[0]))

    iterations, steps = within("prism:iter|"), within("prism:optim")
    clean = clean_unprofiled(own, warmup)
    if not iterations or not steps or not clean:
        return None
    per_op_ns = (statistics.median(own[warmup:]) - statistics.median(clean)) / statistics.median(
        ops_in(s) for s in iterations
    )
    return statistics.median((end - start) - per_op_ns * ops_in((start, end)) for start, end in steps) / 1e6


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
            # The capture the replayed graph was built from (fidelity_lib's folders).
            capture = repeat / ("paced" if Path(report.graph).name == PACED_GRAPH else "slice")
            for rank in report.ranks:
                logs = [CaptureFiles(repeat / run).comm(rank.rank) for run in REAL_RUNS]
                real = [first_call_ms(log, iterations, report.warmup) for log in logs if log.exists()]
                replay = first_call_ms(
                    CaptureFiles(repeat / "replay").comm(rank.rank), iterations, report.warmup
                )
                optim = next((p for p in rank.phases if p.phase == "optim"), None)
                out.append(
                    FirstCall(
                        case=case.name, repeat=repeat.name, rank=rank.rank,
                        real_ms=statistics.median(real) if real else None, replay_ms=replay,
                        optim_measured_ms=optim.measured_ms if optim else None,
                        optim_predicted_ms=optim.predicted_ms if optim else None,
                        excess_ms=rank.measured_iter_ms - rank.predicted_iter_ms,
                        optim_per_op_ms=optim_per_op_ms(capture, rank.rank) if optim else None,
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
            short_case(row.case), row.repeat, str(row.rank), ms(row.real_ms), ms(row.replay_ms), ms(row.excess_ms),
            ms(row.optim_measured_ms), ms(row.optim_predicted_ms), ms(row.optim_per_op_ms),
        )  # fmt: skip
    Console(width=max(120, Console().width)).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
