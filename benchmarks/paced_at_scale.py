"""What a paced capture measures at full scale, against the free-running slice it was paced from.

    python benchmarks/paced_at_scale.py GRAPH SLICE_DIR [--engine bg,fg] [--warmup 5] [--iterations 2]
        [--work-dir DIR] [--no-build]

GRAPH is the graph built from SLICE_DIR (``prism-build-graph SLICE_DIR ...``). For each engine
placement (``bg``: the co-simulation's deferred work in a worker thread; ``fg``: in the
program's thread) it runs ``prism-capture --paced-by GRAPH`` and prints, per captured rank, the
rank's *own* time per iteration (wall time less the time prism held it, the part a paced graph
keeps as compute and gaps) next to the slice's, for clean unprofiled and for profiled
iterations, with the co-simulation's engine time and stall. Unless ``--no-build``, it also builds
the paced graph (same cluster spec as GRAPH) and prints its predicted iteration beside GRAPH's:
at full scale, whatever of the co-simulation's cost is not held time ends up in that prediction.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.graph.build import BuildOptions, build_graph
from prism.graph.graph_io import GraphFormatError, read_metadata
from prism.graph.profiler_overhead import clean_unprofiled
from prism.graph.simulate import load_sim_graph, simulate
from prism.replay.paced_capture import run_paced_capture
from prism.schemas.cluster import ClusterSpec
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.manifest import CaptureManifest, ManifestError, read_manifest
from prism.schemas.replay import ReplayFiles, read_replay_stats

ENGINES = {"bg": True, "fg": False}
COLUMNS = (
    "engine",
    "rank",
    "slice",
    "paced",
    "x",
    "slice prof.",
    "paced prof.",
    "x prof.",
    "engine ms",
    "stall ms",
)


def _ms(values) -> float:
    return statistics.median(values) / 1e6


def own_times(manifest: CaptureManifest) -> dict[int, tuple[float, float]]:
    """Per captured rank: median own time (ms) of its clean unprofiled and of its profiled iterations."""
    warmup = manifest.job.warmup
    return {
        r.rank: (
            _ms(clean_unprofiled(r.result.own_iteration_ns, warmup)),
            _ms(r.result.own_iteration_ns[warmup:]),
        )
        for r in manifest.ranks
    }


def engine_times(capture: Path, manifest: CaptureManifest) -> dict[int, tuple[float, float]]:
    """Per captured rank: median engine time and stall (ms) per clean unprofiled iteration."""
    out = {}
    for r in manifest.ranks:
        stats = read_replay_stats(ReplayFiles(capture).replay_stats(r.rank))
        clean = clean_unprofiled(stats.iterations, manifest.job.warmup)
        out[r.rank] = (_ms(it.engine_ns for it in clean), _ms(it.stall_ns for it in clean))
    return out


def predicted_ms(graph: Path) -> float:
    """The job's simulated steady iteration (its slowest rank), as prism-build-graph prints it."""
    return float(simulate(load_sim_graph(graph)).iteration_ns.max()) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", type=Path, help="graph.parquet built from SLICE_DIR")
    parser.add_argument("slice", type=Path, help="the free-running capture GRAPH was built from")
    parser.add_argument("--engine", default="bg,fg", help="comma-separated: bg, fg")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the paced captures here")
    parser.add_argument("--no-build", action="store_true", help="do not build and simulate the paced graphs")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engine.split(",") if e.strip()]
    try:
        if unknown := [e for e in engines if e not in ENGINES]:
            raise ValueError(f"--engine: unknown {', '.join(unknown)} (choose from {', '.join(ENGINES)})")
        meta = read_metadata(args.graph)
        slice_manifest = read_manifest(args.slice)
    except (ValueError, GraphFormatError, ManifestError, OSError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        compare(args, engines, meta, slice_manifest, args.work_dir)
    else:  # the captures and graphs of an 8192-rank job are large: gone once printed
        with tempfile.TemporaryDirectory(prefix="prism-paced-at-scale-") as tmp:
            compare(args, engines, meta, slice_manifest, Path(tmp))
    return 0


def compare(
    args: argparse.Namespace,
    engines: list[str],
    meta: GraphMetadata,
    slice_manifest: CaptureManifest,
    work: Path,
) -> None:
    """Pace, measure (and build) for each engine placement in ``work``; print the table."""
    console = Console()
    slice_own = own_times(slice_manifest)
    layout = meta.layout
    title = (
        f"paced by {args.graph} (tp={layout['tp']} pp={layout['pp']} dp={layout['dp']}): own ms per iteration"
    )
    table = Table(title=title)
    for column in COLUMNS:
        table.add_column(column, justify="right")
    predictions = {"slice graph": predicted_ms(args.graph)}
    for engine in engines:
        capture = work / f"paced-{engine}"
        console.print(f"paced capture, engine {engine} -> {capture}")
        manifest = run_paced_capture(
            args.graph, capture, warmup=args.warmup, iterations=args.iterations, overwrite=True,
            background_engine=ENGINES[engine],
        )  # fmt: skip
        own, costs = own_times(manifest), engine_times(capture, manifest)
        for rank, (unprofiled, profiled) in sorted(own.items()):
            s_unprofiled, s_profiled = slice_own[rank]
            table.add_row(
                engine, str(rank), f"{s_unprofiled:.1f}", f"{unprofiled:.1f}", f"{unprofiled / s_unprofiled:.2f}",
                f"{s_profiled:.1f}", f"{profiled:.1f}", f"{profiled / s_profiled:.2f}",
                f"{costs[rank][0]:.1f}", f"{costs[rank][1]:.1f}",
            )  # fmt: skip
        if not args.no_build:
            paced_graph = work / f"paced-{engine}.parquet"
            build_graph(
                BuildOptions(
                    capture_dir=capture, out=paced_graph, tp=layout["tp"], pp=layout["pp"],
                    dp=layout["dp"], cluster=ClusterSpec.from_dict(meta.cluster),
                )
            )  # fmt: skip
            predictions[f"paced graph ({engine})"] = predicted_ms(paced_graph)
    console.print(table)
    for name, ms in predictions.items():
        console.print(f"{name}: job iteration {ms:.1f} ms", highlight=False)


if __name__ == "__main__":
    raise SystemExit(main())
