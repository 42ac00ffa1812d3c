"""Cost of prism-build-graph: wall time, peak RSS, file size, time to read one rank.

    .venv/bin/python benchmarks/build_graph.py [--capture DIR] [--dp 64 128] [--repeats 3]

Builds the graph of the capture (default: a fresh default capture, target tp=8 pp=16) for each
``--dp`` (64 gives 8192 ranks, 128 gives 16384) in a child process, so its peak RSS is the
build's own, and prints medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.capture.runner import CaptureOptions, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.graph.io.parquet import read_metadata, read_rank


def build_once(capture: Path, out: Path, dp: int) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one build in a child process."""
    cmd = [
        sys.executable,
        "-m",
        "prism.graph.build.cli",
        str(capture),
        "--tp",
        "8",
        "--pp",
        "16",
        "--dp",
        str(dp),
        "-o",
        str(out),
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    # ru_maxrss of children is the largest child so far: builds run in increasing size order.
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def read_ms(path: Path, samples: int = 20) -> float:
    world = read_metadata(path).layout
    n = world["tp"] * world["pp"] * world["dp"]
    times = []
    for rank in random.Random(0).sample(range(n), samples):
        t0 = time.perf_counter()
        read_rank(path, rank)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", type=Path, default=None)
    parser.add_argument("--dp", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table(title=f"prism-build-graph, tp=8 pp=16, median of {args.repeats}")
    for column in ("ranks", "build wall s", "peak RSS", "file", "read one rank ms"):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        capture = args.capture
        if capture is None:
            capture = Path(tmp) / "capture"
            run_capture(CaptureOptions(config=GPTConfig(), out_dir=capture))
        for dp in sorted(args.dp):
            out = Path(tmp) / f"graph-dp{dp}.parquet"
            runs = [build_once(capture, out, dp) for _ in range(args.repeats)]
            wall = statistics.median(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            table.add_row(
                f"{8 * 16 * dp:,}", f"{wall:.1f}", f"{rss / 2**30:.2f} GiB",
                f"{out.stat().st_size / 2**20:.1f} MiB", f"{read_ms(out):.1f}",
            )  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
