"""Speed of the simulation: load time, simulate time, nodes per second, peak RSS.

    .venv/bin/python benchmarks/simulate_speed.py [--capture DIR] [--dp 8 64 128] [--repeats 3]

Builds the tp=8 pp=16 graph of the capture (default: a fresh default capture) for each
``--dp`` (8: 1024 ranks, 64: 8192, 128: 16384), then times, in a child process per graph,
loading it and simulating two iterations (after one untimed run that compiles the engine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.capture.runner import CaptureOptions, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.build.builder import BuildOptions, build_graph
from prism.schemas.cluster import preset

CHILD = """
import json, resource, sys, time
from prism.graph.sim.simulate import simulate
from prism.graph.sim.load import load_sim_graph
path, repeats = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter(); graph = load_sim_graph(path); load_s = time.perf_counter() - t0
simulate(graph)  # compiles the engine (cached on disk after the first run)
runs = []
for _ in range(repeats):
    t0 = time.perf_counter(); simulate(graph); runs.append(time.perf_counter() - t0)
print(json.dumps({"nodes": len(graph.kind), "load_s": load_s, "sim_s": runs,
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def measure(path: Path, repeats: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(repeats)], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", type=Path, default=None)
    parser.add_argument("--dp", type=int, nargs="+", default=[8, 64, 128])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table(title=f"simulation speed, tp=8 pp=16, 2 iterations, median of {args.repeats}")
    for column in ("ranks", "nodes", "load s", "simulate s", "nodes/s (simulate)", "peak RSS"):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        capture = args.capture
        if capture is None:
            capture = Path(tmp) / "capture"
            run_capture(CaptureOptions(config=GPTConfig(), out_dir=capture))
        for dp in args.dp:
            path = Path(tmp) / f"graph-dp{dp}.parquet"
            build_graph(
                BuildOptions(capture_dir=capture, out=path, tp=8, pp=16, dp=dp, cluster=preset("h100-ib"))
            )
            m = measure(path, args.repeats)
            sim_s = statistics.median(m["sim_s"])
            table.add_row(
                f"{8 * 16 * dp:,}", f"{m['nodes']:,}", f"{m['load_s']:.1f}", f"{sim_s:.2f}",
                f"{2 * m['nodes'] / sim_s / 1e6:.1f} M", f"{m['rss'] / 2**30:.2f} GiB",
            )  # fmt: skip
            path.unlink()
    Console().print(table)


if __name__ == "__main__":
    main()
