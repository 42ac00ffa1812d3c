"""Re-price a kept fidelity run under other cluster specs or profiler corrections.

    .venv/bin/python benchmarks/fidelity_respec.py RUN.json WORK_DIR NAME=SPEC.toml [NAME=SPEC.toml ...] \
        [--no-table NAME ...] [--correction phase|role|none ...] [--capture slice|paced] [--json out.json]

A fidelity run's real medians move by several percent between runs of the same code on a
shared machine, so two runs cannot tell two comm models apart. This script keeps one run's
real side and slices (``benchmarks/fidelity.py --json RUN.json --work-dir WORK_DIR``) and
rebuilds every repeat's graph from its own slice under each spec, simulating it as the run
did: the simulation rows differ by the spec alone. ``NAME=SPEC.toml`` names a spec;
``NAME-line`` (with ``--no-table NAME``) is the same spec with its ``measured`` table
dropped, i.e. priced by its α-β line. Each ``--correction`` builds every spec's graphs with
that profiler correction (``prism-build-graph --profiler-correction``; default: phase), in
columns ``NAME/CORRECTION`` when there are several. ``--capture paced`` rebuilds from each
repeat's paced capture instead (a run with ``--paced``) and compares with its 'paced' rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from prism.fidelity import RunSettings, build_case_graph, case_dir, parse_case
from prism.graph.build.profiler_overhead import Correction
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas.cluster import ClusterSpec

console = Console(width=max(120, Console().width))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the fidelity run's --json file")
    parser.add_argument("work_dir", type=Path, help="the fidelity run's --work-dir")
    parser.add_argument("specs", nargs="+", help="NAME=SPEC.toml")
    parser.add_argument("--no-table", action="append", default=[], help="also price NAME without its table")
    parser.add_argument(
        "--correction", action="append", choices=[c.value for c in Correction], default=None,
        help="profiler correction of the rebuilt graphs (repeat for several; default: phase)",
    )  # fmt: skip
    parser.add_argument(
        "--capture", choices=("slice", "paced"), default="slice",
        help="rebuild from each repeat's slice (rows 'simulation') or paced capture (rows 'paced')",
    )  # fmt: skip
    parser.add_argument("--sim-iterations", type=int, default=RunSettings.sim_iterations)
    parser.add_argument("--json", type=Path, default=None, help="write the re-priced errors here")
    return parser.parse_args(argv)


Variant = tuple[ClusterSpec, Correction]
"""How a graph is rebuilt: under which spec, with which profiler correction."""


def load_variants(args: argparse.Namespace) -> dict[str, Variant]:
    """Every spec under every ``--correction``, by column name."""
    specs = load_specs(args)
    corrections = [Correction(c) for c in dict.fromkeys(args.correction or [Correction.PHASE.value])]
    if len(corrections) == 1:
        return {name: (spec, corrections[0]) for name, spec in specs.items()}
    return {f"{name}/{c.value}": (spec, c) for name, spec in specs.items() for c in corrections}


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
    return specs


SOURCE_OF_CAPTURE = {"slice": "simulation", "paced": "paced"}


def reprice(
    run: dict, work_dir: Path, variants: dict[str, Variant], sim_iterations: int, capture: str = "slice"
) -> list[dict]:
    """One row per (spec, case, rank): the real median and the re-priced prediction's median."""
    rows = []
    records = [r for r in run["records"] if r["source"] == SOURCE_OF_CAPTURE[capture]]
    for case in dict.fromkeys(r["case"] for r in records):
        config = parse_case(case)
        repeats = sorted(
            case_dir(work_dir, case).glob("repeat*"), key=lambda p: int(p.name.removeprefix("repeat"))
        )
        for name, (spec, correction) in variants.items():
            per_repeat = []
            for repeat in repeats:
                graph = repeat / f"respec-{name.replace('/', '-')}.parquet"
                build_case_graph(config, repeat / capture, graph, spec, correction)
                per_repeat.append(
                    simulate(load_sim_graph(graph), iterations=sim_iterations).iteration_ns / 1e6
                )
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        variants = load_variants(args)
        run = json.loads(args.run.read_text())
    except (ValueError, OSError) as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    rows = reprice(run, args.work_dir, variants, args.sim_iterations, args.capture)
    if not rows:
        console.print(
            f"[bold red]error:[/] {args.run} has no '{SOURCE_OF_CAPTURE[args.capture]}' rows", highlight=False
        )
        return 2
    cases = list(dict.fromkeys(r["case"] for r in rows))
    table = Table(
        title=f"simulation error (%) of the same {args.capture} captures and real runs under each spec"
    )
    table.add_column("case")
    table.add_column("rank", justify="right")
    table.add_column("real ms", justify="right")
    for name in variants:
        table.add_column(name, justify="right")
    keys = list(dict.fromkeys((r["case"], r["rank"]) for r in rows))
    by = {(r["spec"], r["case"], r["rank"]): r for r in rows}
    for case, rank in keys:
        cells = [f"{by[(n, case, rank)]['iter_err_pct']:+.1f}" for n in variants]
        table.add_row(
            f"C{cases.index(case) + 1}",
            str(rank),
            f"{by[(next(iter(variants)), case, rank)]['real_ms']:.1f}",
            *cells,
        )
    means = [np.mean([abs(r["iter_err_pct"]) for r in rows if r["spec"] == n]) for n in variants]
    table.add_row("mean |err|", "", "", *(f"{m:.1f}" for m in means))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
