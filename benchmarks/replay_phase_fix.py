"""What a kept fidelity run's replays would measure if one phase of the graph were right.

    .venv/bin/python benchmarks/replay_phase_fix.py WORK_DIR OUT --case "tp=2 pp=1 ..." \
        [--phase optim] [--repeats 3] [--warmup 16] [--iterations 3]

For the first ``--repeats`` repeats of a case kept by ``benchmarks/fidelity.py --paced
--work-dir WORK_DIR``: the repeat's paced graph is copied, and a second copy has the compute
nodes (durations and gaps) of ``--phase`` scaled by the replayed rank's measured / predicted
time of that phase (its ``report.json``), so the virtual peers run that phase as the replayed
rank did. Then, beside the usual load: every rank real, a replay of each role's rank against
the graph as built, one against the fixed graph, every rank real again. The printed rows give
both replays against the mean of the two real runs, and their paired difference: how much of
the replay's error that phase's prediction makes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
from fidelity_cases import CaseError, case_label, parse_case
from fidelity_lib import PACED_GRAPH, RunSettings, case_dir, measure_real, replay_roles
from rich.console import Console
from rich.table import Table

from prism.graph.graph_io import GraphWriter, read_metadata, read_rank
from prism.schemas.graph_format import DUR_NS, GAP_NS, KIND, PHASE, NodeKind
from prism.schemas.layout import ParallelLayout
from prism.schemas.replay import ReplayReport

FIXED_GRAPH = "fixed.parquet"


def with_phase_scaled(src: Path, dst: Path, phase: str, factor: float) -> None:
    """``src`` written to ``dst`` with ``phase``'s compute durations and gaps times ``factor``."""
    meta = read_metadata(src)
    with GraphWriter(dst, meta) as writer:
        for rank in range(ParallelLayout.from_dict(meta.layout).world_size):
            table = read_rank(src, rank)
            picked = (np.asarray(table.column(PHASE).to_pylist()) == phase) & (
                np.asarray(table.column(KIND).to_pylist()) == NodeKind.COMPUTE.value
            )
            for column in (DUR_NS, GAP_NS):
                values = table.column(column).to_numpy().copy()
                values[picked] = np.round(values[picked] * factor).astype(np.int64)
                table = table.set_column(
                    table.schema.get_field_index(column), column, pa.array(values, pa.int64())
                )
            writer.write_ranks(table)


def phase_factor(report_file: Path, phase: str) -> float:
    """Measured / predicted time of ``phase``, median over the replayed ranks of a report."""
    ratios = [
        p.measured_ms / p.predicted_ms
        for rank in ReplayReport.from_dict(json.loads(report_file.read_text())).ranks
        for p in rank.phases
        if p.phase == phase and p.predicted_ms > 0
    ]
    if not ratios:
        raise ValueError(f"{report_file}: no replayed rank has a '{phase}' phase")
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path, help="the fidelity run's --work-dir (a run with --paced)")
    parser.add_argument("out", type=Path, help="where this run's captures and graphs go")
    parser.add_argument("--case", required=True, help="the case, as fidelity.py --case names it")
    parser.add_argument("--phase", default="optim")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        config = parse_case(args.case)
        kept = sorted(case_dir(args.work_dir, case_label(config)).glob("repeat*"))[: args.repeats]
        if not kept or not all((r / PACED_GRAPH).is_file() for r in kept):
            raise ValueError(f"no paced repeats of {case_label(config)} under {args.work_dir}")
        factors = [phase_factor(r / "replay" / "report.json", args.phase) for r in kept]
    except (CaseError, ValueError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    settings = RunSettings(warmup=args.warmup, iterations=args.iterations)
    console = Console()
    table = Table(
        title=f"{case_label(config)}: replays against the paced graph, as built and with '{args.phase}' fixed"
    )
    for column in ("repeat", "rank", "factor", "real ms", "replay", "fixed", "fixed − replay"):
        table.add_column(column, justify="right")
    for repeat, factor in zip(kept, factors, strict=True):
        out = case_dir(args.out, case_label(config)) / repeat.name
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repeat / PACED_GRAPH, out / PACED_GRAPH)
        with_phase_scaled(repeat / PACED_GRAPH, out / FIXED_GRAPH, args.phase, factor)
        console.print(f"{repeat.name}: real, replay, replay with '{args.phase}' x{factor:.2f}, real")
        before = measure_real(config, settings, out / "real")
        built = replay_roles(config, settings, out, PACED_GRAPH)
        (out / "replay").rename(out / "replay_built")
        fixed = replay_roles(config, settings, out, FIXED_GRAPH)
        after = measure_real(config, settings, out / "real_after")
        for rank in sorted(built):
            real = (before[rank].iter_ns + after[rank].iter_ns) / 2

            def err(ns: float, real: float = real) -> float:
                return (ns / real - 1) * 100

            table.add_row(
                repeat.name, str(rank), f"{factor:.2f}", f"{real / 1e6:.1f}", f"{err(built[rank].iter_ns):+.1f}%",
                f"{err(fixed[rank].iter_ns):+.1f}%", f"{err(fixed[rank].iter_ns) - err(built[rank].iter_ns):+.1f}",
            )  # fmt: skip
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
