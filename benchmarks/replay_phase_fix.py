"""What a kept fidelity run's replays would measure if one phase of the graph were right, or
against the graph built with another profiler correction.

    .venv/bin/python benchmarks/replay_phase_fix.py WORK_DIR OUT --case "tp=2 pp=1 ..." \
        [--phase optim | --correction role --spec SPEC.toml] [--repeats 3] [--warmup 16] [--iterations 3]

For the first ``--repeats`` repeats of a case kept by ``benchmarks/fidelity.py --paced
--work-dir WORK_DIR``: the repeat's paced graph is copied, and a second copy has the compute
nodes (durations and gaps) of ``--phase`` scaled by the replayed rank's measured / predicted
time of that phase (its ``report.json``), so the virtual peers run that phase as the replayed
rank did. Then, beside the usual load: every rank real, a replay of each role's rank against
the graph as built, one against the fixed graph, every rank real again. The printed rows give
both replays against the mean of the two real runs, and their paired difference: how much of
the replay's error that phase's prediction makes. With ``--correction`` the second graph is
instead rebuilt from the repeat's paced capture with that profiler correction under ``--spec``
(the run's cluster spec): an A/B of two corrections, each replay beside the same real runs.
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
from fidelity_lib import PACED_GRAPH, RunSettings, build_case_graph, case_dir, measure_real, replay_roles
from rich.console import Console
from rich.table import Table

from prism.graph.graph_io import GraphWriter, read_metadata, read_rank
from prism.graph.profiler_overhead import Correction
from prism.schemas.cluster import ClusterSpec
from prism.schemas.graph_format import DUR_NS, GAP_NS, KIND, PHASE, NodeKind
from prism.schemas.layout import ParallelLayout
from prism.schemas.replay import ReplayReport

SECOND_GRAPH = "second.parquet"


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path, help="the fidelity run's --work-dir (a run with --paced)")
    parser.add_argument("out", type=Path, help="where this run's captures and graphs go")
    parser.add_argument("--case", required=True, help="the case, as fidelity.py --case names it")
    second = parser.add_mutually_exclusive_group()
    second.add_argument("--phase", default=None, help="the phase to fix (default: optim)")
    second.add_argument(
        "--correction", choices=[c.value for c in Correction], default=None,
        help="rebuild the second graph from the paced capture with this profiler correction",
    )  # fmt: skip
    parser.add_argument("--spec", type=Path, default=None, help="cluster spec of the rebuilt graph")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args(argv)
    if (args.correction is None) != (args.spec is None):
        parser.error("--correction and --spec go together")
    args.phase = args.phase or "optim"
    return args


def second_graph(args: argparse.Namespace, config, repeat: Path, out: Path) -> str:
    """Write the graph the second replay runs against to ``out / SECOND_GRAPH``; its label."""
    if args.correction is not None:
        build_case_graph(
            config,
            repeat / "paced",
            out / SECOND_GRAPH,
            ClusterSpec.load(args.spec),
            Correction(args.correction),
        )
        return f"{args.correction} correction"
    factor = phase_factor(repeat / "replay" / "report.json", args.phase)
    with_phase_scaled(repeat / PACED_GRAPH, out / SECOND_GRAPH, args.phase, factor)
    return f"'{args.phase}' x{factor:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = parse_case(args.case)
        kept = sorted(case_dir(args.work_dir, case_label(config)).glob("repeat*"))[: args.repeats]
        if not kept or not all((r / PACED_GRAPH).is_file() for r in kept):
            raise ValueError(f"no paced repeats of {case_label(config)} under {args.work_dir}")
        if args.correction is None:
            for repeat in kept:
                phase_factor(repeat / "replay" / "report.json", args.phase)
        else:
            ClusterSpec.load(args.spec)
    except (CaseError, ValueError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    settings = RunSettings(warmup=args.warmup, iterations=args.iterations)
    console = Console()
    what = f"{args.correction} correction" if args.correction else f"'{args.phase}' fixed"
    table = Table(title=f"{case_label(config)}: replays against the paced graph, as built and with {what}")
    for column in ("repeat", "rank", "second graph", "real ms", "replay", "second", "second − replay"):
        table.add_column(column, justify="right")
    for repeat in kept:
        out = case_dir(args.out, case_label(config)) / repeat.name
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repeat / PACED_GRAPH, out / PACED_GRAPH)
        label = second_graph(args, config, repeat, out)
        console.print(f"{repeat.name}: real, replay, replay with {label}, real")
        before = measure_real(config, settings, out / "real")
        built = replay_roles(config, settings, out, PACED_GRAPH)
        (out / "replay").rename(out / "replay_built")
        fixed = replay_roles(config, settings, out, SECOND_GRAPH)
        after = measure_real(config, settings, out / "real_after")
        for rank in sorted(built):
            real = (before[rank].iter_ns + after[rank].iter_ns) / 2

            def err(ns: float, real: float = real) -> float:
                return (ns / real - 1) * 100

            table.add_row(
                repeat.name, str(rank), label, f"{real / 1e6:.1f}", f"{err(built[rank].iter_ns):+.1f}%",
                f"{err(fixed[rank].iter_ns):+.1f}%", f"{err(fixed[rank].iter_ns) - err(built[rank].iter_ns):+.1f}",
            )  # fmt: skip
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
