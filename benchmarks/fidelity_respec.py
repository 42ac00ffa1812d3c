"""Re-price kept fidelity runs under other cluster specs, without one of a spec's tables, or
under other profiler corrections.

    .venv/bin/python benchmarks/fidelity_respec.py RUN.json WORK_DIR NAME=SPEC.toml [NAME=SPEC.toml ...] \
        [--also RUN.json=WORK_DIR ...] [--without TABLE ...] [--no-table NAME ...] \
        [--correction phase|role|none ...] [--capture slice|paced] [--floor FLOOR.json ...] [--json out.json]

A fidelity run's real medians move by several percent between runs of the same code on a
shared machine, so two runs cannot tell two comm models apart. This script keeps a run's real
side and slices (``benchmarks/fidelity.py --json RUN.json --work-dir WORK_DIR``; ``--also``
pools more runs) and rebuilds every repeat's graph from its own slice under each spec,
simulating it as the run did: the simulation rows differ by the spec alone. The built-in GPT's
cases are built for their own job, a program's at its captured layout. ``NAME=SPEC.toml``
names a spec; ``--without TABLE`` adds, for every spec, ``NAME-no-TABLE``: the same spec
without that pricing mechanism (``busy_call``, ``wake_compute``, ``measured``; ``skew``: the
simulation's wait for each collective's last member), the one-at-a-time switch by which a
mechanism shows what it pays; ``--no-table NAME`` adds ``NAME-line``, NAME without its
``measured`` table. Each
``--correction`` builds every spec's graphs with that profiler correction
(``prism-build-graph --profiler-correction``; default: phase), in columns ``NAME/CORRECTION``
when there are several. ``--capture paced`` rebuilds from each repeat's paced capture instead
(a run with ``--paced``) and compares with its 'paced' rows.

Besides the case-by-case table it prints, per column, the records pooled by family
(``prism.fidelity.families``): the mean signed error with its 95 % interval and the median
|error|, beside the floor's median where ``--floor`` gives the runs' noise-floor records.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from prism.fidelity import RunSettings, build_case_graph, case_dir, parse_case
from prism.fidelity.families import FLOOR, family_rows
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.build.profiler_overhead import Correction
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas.cluster import ClusterSpec

console = Console(width=max(120, Console().width))

MECHANISMS = {
    "busy_call": {"busy_call": {}},
    "wake_compute": {"wake_compute": {}},
    "measured": {"measured": {}},
}
"""The spec's pricing mechanisms ``--without`` switches off, and the fields that hold each."""
SKEW = "skew"
"""``--without skew``: simulate without each collective's expected wait for its last member
(the graph's ``skew_ns``, from the capture's iteration noise)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the fidelity run's --json file")
    parser.add_argument("work_dir", type=Path, help="the fidelity run's --work-dir")
    parser.add_argument("specs", nargs="+", help="NAME=SPEC.toml")
    parser.add_argument(
        "--also", action="append", default=[], metavar="RUN.json=WORK_DIR",
        help="another kept run, pooled with the first (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--without", action="append", default=[], choices=sorted([*MECHANISMS, SKEW]),
        help="also price every spec without this mechanism (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-table", action="append", default=[], help="also price NAME without its table")
    parser.add_argument(
        "--correction", action="append", choices=[c.value for c in Correction], default=None,
        help="profiler correction of the rebuilt graphs (repeat for several; default: phase)",
    )  # fmt: skip
    parser.add_argument(
        "--capture", choices=("slice", "paced"), default="slice",
        help="rebuild from each repeat's slice (rows 'simulation') or paced capture (rows 'paced')",
    )  # fmt: skip
    parser.add_argument(
        "--floor", action="append", default=[], type=Path,
        help="a noise_floor.py --json of the runs: the families' floor medians (repeatable)",
    )  # fmt: skip
    parser.add_argument("--sim-iterations", type=int, default=RunSettings.sim_iterations)
    parser.add_argument("--json", type=Path, default=None, help="write the re-priced errors here")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Variant:
    """How a graph is rebuilt and simulated."""

    spec: ClusterSpec
    correction: Correction
    skew: bool = True
    """Simulate each collective's wait for its last member."""


def load_variants(args: argparse.Namespace) -> dict[str, Variant]:
    """Every spec under every ``--correction``, by column name."""
    specs = load_specs(args)
    corrections = [Correction(c) for c in dict.fromkeys(args.correction or [Correction.PHASE.value])]
    variants = {
        name if len(corrections) == 1 else f"{name}/{c.value}": Variant(spec, c)
        for name, spec in specs.items()
        for c in corrections
    }
    if SKEW in args.without:
        variants |= {f"{name}-no-{SKEW}": replace(v, skew=False) for name, v in variants.items()}
    return variants


def load_specs(args: argparse.Namespace) -> dict[str, ClusterSpec]:
    specs = {}
    for item in args.specs:
        name, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"spec {item!r} is not NAME=SPEC.toml")
        specs[name] = ClusterSpec.load(path)
    for name in args.no_table:
        if name not in specs:
            raise ValueError(f"--no-table {name}: no spec of that name")
        specs[f"{name}-line"] = replace(specs[name], measured={})
    for name, spec in list(specs.items()):
        for mechanism in dict.fromkeys(m for m in args.without if m != SKEW):
            specs[f"{name}-no-{mechanism}"] = replace(spec, **MECHANISMS[mechanism])
    return specs


def load_runs(args: argparse.Namespace) -> list[tuple[dict, Path]]:
    """The kept runs: each one's records and work directory."""
    runs = [(args.run, args.work_dir)]
    for item in args.also:
        run, sep, work_dir = item.partition("=")
        if not sep:
            raise ValueError(f"--also {item!r} is not RUN.json=WORK_DIR")
        runs.append((Path(run), Path(work_dir)))
    return [(json.loads(run.read_text()), work_dir) for run, work_dir in runs]


SOURCE_OF_CAPTURE = {"slice": "simulation", "paced": "paced"}


def build_repeat_graph(
    case: str, repeat: Path, capture: str, graph: Path, spec: ClusterSpec, correction: Correction
) -> None:
    """A repeat's graph as the run built it: a built-in GPT case (whose layout leads its label)
    for its own job from the repeat's ``capture``, a program at its captured layout."""
    if case.startswith("tp="):
        build_case_graph(parse_case(case), repeat / capture, graph, spec, correction)
    elif capture != "slice":
        raise ValueError(f"{case!r} is a program's case: its runs keep no {capture} capture")
    else:
        options = BuildOptions(
            capture_dir=repeat / "capture", out=graph, cluster=spec, profiler_correction=correction
        )
        build_graph(options)


def reprice(
    run: dict, work_dir: Path, variants: dict[str, Variant], sim_iterations: int, capture: str = "slice"
) -> list[dict]:
    """One row per (spec, case, rank): the real median and the re-priced prediction's median."""
    rows = []
    records = [r for r in run["records"] if r["source"] == SOURCE_OF_CAPTURE[capture]]
    for case in dict.fromkeys(r["case"] for r in records):
        repeats = sorted(
            case_dir(work_dir, case).glob("repeat*"), key=lambda p: int(p.name.removeprefix("repeat"))
        )
        if not repeats:
            raise ValueError(f"{work_dir} keeps no repeat of {case!r}: give the run's --work-dir")
        for name, variant in variants.items():
            per_repeat = []
            for repeat in repeats:
                graph = repeat / f"respec-{name.replace('/', '-')}.parquet"
                build_repeat_graph(case, repeat, capture, graph, variant.spec, variant.correction)
                sim_graph = load_sim_graph(graph)
                if not variant.skew:
                    sim_graph = replace(sim_graph, skew=None)
                per_repeat.append(simulate(sim_graph, iterations=sim_iterations).iteration_ns / 1e6)
                graph.unlink()
            pred = np.median(np.stack(per_repeat), axis=0)
            for r in (r for r in records if r["case"] == case):
                err = (pred[r["rank"]] - r["real_iter_ms"]) / r["real_iter_ms"] * 100
                rows.append(
                    {"spec": name, "case": case, "rank": r["rank"], "real_ms": r["real_iter_ms"],
                     "pred_ms": round(float(pred[r["rank"]]), 3), "iter_err_pct": round(float(err), 2)}
                )  # fmt: skip
            console.print(f"{name}: {case} done", highlight=False)
    return rows


def families_table(rows: list[dict], variants: list[str], floors: list[dict]) -> Table:
    """Per family and column: bias with its interval, median |error|, the floor's median."""
    pooled = family_rows([{**r, "source": r["spec"]} for r in rows] + floors)
    by = {(row.family, row.source): row for row in pooled}
    table = Table(title="the same records by family")
    for column in ("family", "spec", "records", "bias (95 %)", "median |error|", "floor's median"):
        table.add_column(column, justify="left" if column in ("family", "spec") else "right")
    for family in dict.fromkeys(row.family for row in pooled):
        for name in variants:
            row = by[(family, name)]
            floor = "" if row.floor_median_pct is None else f"{row.floor_median_pct:.1f}"
            bias = f"{row.bias_pct:+.1f} ± {row.interval_pct:.1f}"
            table.add_row(family, name, str(row.records), bias, f"{row.median_abs_pct:.1f}", floor)
        table.add_section()
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        variants = load_variants(args)
        runs = load_runs(args)
        floors = [
            {**r, "source": FLOOR}
            for path in args.floor
            for r in json.loads(path.read_text())["records"]
            if r["source"] == FLOOR
        ]
        rows = [
            {**row, "run": i}
            for i, (run, work_dir) in enumerate(runs)
            for row in reprice(run, work_dir, variants, args.sim_iterations, args.capture)
        ]
    except (ValueError, OSError) as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    if not rows:
        console.print(
            f"[bold red]error:[/] {args.run} has no '{SOURCE_OF_CAPTURE[args.capture]}' rows", highlight=False
        )
        return 2
    cases = list(dict.fromkeys((r["run"], r["case"]) for r in rows))
    table = Table(
        title=f"simulation error (%) of the same {args.capture} captures and real runs under each spec"
    )
    table.add_column("case")
    table.add_column("rank", justify="right")
    table.add_column("real ms", justify="right")
    for name in variants:
        table.add_column(name, justify="right")
    keys = list(dict.fromkeys((r["run"], r["case"], r["rank"]) for r in rows))
    by = {(r["spec"], r["run"], r["case"], r["rank"]): r for r in rows}
    for run, case, rank in keys:
        cells = [f"{by[(n, run, case, rank)]['iter_err_pct']:+.1f}" for n in variants]
        table.add_row(
            f"C{cases.index((run, case)) + 1}",
            str(rank),
            f"{by[(next(iter(variants)), run, case, rank)]['real_ms']:.1f}",
            *cells,
        )
    means = [np.mean([abs(r["iter_err_pct"]) for r in rows if r["spec"] == n]) for n in variants]
    table.add_row("mean |err|", "", "", *(f"{m:.1f}" for m in means))
    console.print(table)
    console.print(families_table(rows, list(variants), floors))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
