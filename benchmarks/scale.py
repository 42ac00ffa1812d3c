"""How prism grows with the world: build, read one rank, simulate and replay at 1 K to 131 K ranks.

    .venv/bin/python benchmarks/scale.py [--capture DIR] [--dp 8 64 256 1024] [--replay-rank 123]
    .venv/bin/python benchmarks/scale.py --program-captures DIR [DIR ...] [--replay-rank R]

Builds the default capture's graph (tiny GPT, tp=8 pp=16; ``--dp`` 8, 64, 256, 1024 and 2048
give 1,024, 8,192, 32,768, 131,072 and 262,144 ranks), or each capture of a program (one per
world, each at its own layout: a program's graph keeps the layout it was captured at), with
``prism-build-graph --no-simulate``, reads single ranks from it, simulates it with
``prism-simulate`` and replays one rank with ``prism-replay`` (a program's from the folder it
runs in), each step in a process of its own: its wall time and the peak RSS of its largest process. A
step whose estimated memory exceeds what this machine has free is not run, and the table says
what it would need. Last, how each measure grows with the world: the exponent k of
measure ∝ ranks^k between successive sizes (1 is linear).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

from prism.capture.runner import CaptureOptions, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build.builder import MEMORY_BASE_BYTES, SIMULATE_BYTES_PER_NODE
from prism.graph.io.parquet import GraphReader
from prism.graph.io.parts import graph_bytes, remove_graph
from prism.graph.io.reader import read_metadata
from prism.graph.sim.folded import recorded_replicas
from prism.schemas.layout import ParallelLayout

_PEAK = """\
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
if code.returncode:
    sys.stderr.write(code.stderr[-2000:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
sys.exit(code.returncode)
"""

_READ = """\
import random, statistics, sys, time
from prism.graph.io.parquet import read_rank
path, world, samples = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
read_rank(path, 0)  # libraries loaded and warm, as in any reader that has read before
times = []
for rank in random.Random(0).sample(range(world), samples):
    t0 = time.perf_counter()
    read_rank(path, rank)
    times.append((time.perf_counter() - t0) * 1e3)
print(statistics.median(times), max(times))
"""


@dataclass
class Step:
    """One command's cost, or why it was not run."""

    wall_s: float | None = None
    peak_bytes: int | None = None
    skipped: str = ""

    def cells(self) -> tuple[str, str]:
        if self.skipped:
            return self.skipped, ""
        return f"{self.wall_s:.1f}", f"{self.peak_bytes / 2**30:.2f}"


def run_step(cmd: list[str]) -> Step:
    """Run ``cmd`` in a child process; its wall time and the peak RSS of its largest process."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return Step(wall_s=wall, peak_bytes=int(done.stdout.split()[-1]))


def engine_step(cmd: list[str], nodes: int) -> Step:
    """A step that holds ``nodes`` nodes in the engine's arrays: run where they fit."""
    need = MEMORY_BASE_BYTES + SIMULATE_BYTES_PER_NODE * nodes
    if need > psutil.virtual_memory().available:
        return Step(skipped=f"needs ~{need / 2**30:.0f} GiB")
    return run_step(cmd)


def exponent(a: float | None, b: float | None, ranks_a: int, ranks_b: int) -> str:
    if not a or not b:
        return "-"
    return f"{math.log(b / a) / math.log(ranks_b / ranks_a):.2f}"


def targets(args: argparse.Namespace, tmp: Path) -> list[tuple[Path, list[str]]]:
    """(capture, layout options for the build) of every world measured, smallest first."""
    if args.program_captures:
        return [(capture, []) for capture in args.program_captures]
    capture = args.capture
    if capture is None:
        capture = tmp / "capture"
        run_capture(CaptureOptions(config=GPTConfig(), out_dir=capture))
    return [(capture, ["--tp", "8", "--pp", "16", "--dp", str(dp)]) for dp in sorted(args.dp)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", type=Path, help="a default capture (made afresh if not given)")
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument(
        "--program-captures", type=Path, nargs="+", help="captures of a program, one per world, instead"
    )
    parser.add_argument("--replay-rank", type=int, default=123, help="rank replayed at every size")
    parser.add_argument("--reads", type=int, default=20, help="random ranks read at every size")
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    rows, layouts = [], []
    with tempfile.TemporaryDirectory(prefix="prism-scale-") as tmp:
        for i, (capture, layout_options) in enumerate(targets(args, Path(tmp))):
            graph = Path(tmp) / f"graph-{i}.parquet"
            build = run_step([
                str(bin_dir / "prism-build-graph"), str(capture), *layout_options, "--no-simulate", "-o", str(graph),
            ])  # fmt: skip
            layout = ParallelLayout.from_dict(read_metadata(graph).layout)
            ranks = layout.world_size
            layouts.append(str(layout))
            with GraphReader(graph) as reader:
                nodes, files = reader.num_rows, reader.num_parts
            read = subprocess.run(
                [sys.executable, "-c", _READ, str(graph), str(ranks), str(args.reads)],
                capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            replica_of = recorded_replicas(graph)  # the simulation reads each distinct replica once
            replicas = 1 if replica_of is None else len(replica_of)
            distinct = nodes if replica_of is None else nodes * len(np.unique(replica_of)) // replicas
            simulate = engine_step(
                [str(bin_dir / "prism-simulate"), str(graph), "-o", str(Path(tmp) / "summary.json")], distinct
            )
            replay = engine_step(  # the co-simulation: the distinct replicas and the real rank's
                [str(bin_dir / "prism-replay"), str(graph), "--rank", str(args.replay_rank),
                 "-o", str(Path(tmp) / f"replay-{i}"), "--overwrite"],
                distinct + nodes // replicas,
            )  # fmt: skip
            rows.append(
                (ranks, nodes, files, graph_bytes(graph), build, [float(x) for x in read], simulate, replay)
            )
            remove_graph(graph)
    what = (
        "tiny GPT tp=8 pp=16" if not args.program_captures else f"a program's captures: {', '.join(layouts)}"
    )
    table = Table(title=f"prism at scale: {what}, one process per step (wall s, peak RSS GiB)")
    for column in (
        "ranks", "nodes", "build s", "M nodes/s", "build GiB", "files", "MiB", "B/node", "read rank ms (median / max)",
        "simulate s", "simulate GiB", f"replay rank {args.replay_rank} s", "replay GiB",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for ranks, nodes, files, size, build, read, simulate, replay in rows:
        table.add_row(
            f"{ranks:,}", f"{nodes / 1e6:.1f} M", *build.cells()[:1], f"{nodes / build.wall_s / 1e6:.1f}",
            build.cells()[1], str(files), f"{size / 2**20:.0f}", f"{size / nodes:.2f}", f"{read[0]:.1f} / {read[1]:.1f}",
            *simulate.cells(), *replay.cells(),
        )  # fmt: skip
    growth = Table(title="growth between sizes: k in measure ∝ ranks^k (1 = linear)")
    for column in (
        "ranks", "build s", "build M nodes/s more", "build GiB", "read rank ms", "simulate s", "simulate GiB"
    ):  # fmt: skip
        growth.add_column(column, justify="right")
    for (ra, na, _, _, ba, rda, sa, _), (rb, nb, _, _, bb, rdb, sb, _) in zip(rows, rows[1:], strict=False):
        growth.add_row(  # the rate of the nodes the larger world adds: the build's fixed part left out
            f"{ra:,} -> {rb:,}", exponent(ba.wall_s, bb.wall_s, ra, rb), f"{(nb - na) / (bb.wall_s - ba.wall_s) / 1e6:.1f}",
            exponent(ba.peak_bytes, bb.peak_bytes, ra, rb), exponent(rda[0], rdb[0], ra, rb),
            exponent(sa.wall_s, sb.wall_s, ra, rb), exponent(sa.peak_bytes, sb.peak_bytes, ra, rb),
        )  # fmt: skip
    console = Console(width=200)
    console.print(table)
    console.print(growth)
    console.print(
        f"memory here: {psutil.virtual_memory().total / 2**30:.0f} GiB; a step that would not fit is not run "
        f"(estimate: {MEMORY_BASE_BYTES / 2**30:.0f} GiB + {SIMULATE_BYTES_PER_NODE} B a node, the engine's arrays)"
    )


if __name__ == "__main__":
    main()
