"""How a gloo all-reduce's latency grows with the compute before it, size by size.

    .venv/bin/python benchmarks/cold_gaps.py [--gaps-ms 0 4 16 64] [--sizes 65536 2097152 8388608 16777216] [--rounds 2]

Two processes time all-reduces as ``prism-calibrate`` does (``prism.graph.comm.bench``: the
latency after the last member arrived, mean over calls), each call after a gap of busy compute,
one benchmark per gap, the gaps taken in turn round after round so that the machine's slow
spells fall on all of them. The table gives each size's mean latency after each gap (the
median over rounds) and its extra over back-to-back calls: what the spec's ``cold_call``
table must reach for a job whose collectives come after long compute (a gradient all-reduce,
after the whole backward).
"""

from __future__ import annotations

import argparse
import statistics

from rich.console import Console
from rich.table import Table

from prism.graph.comm.bench import run_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gaps-ms", type=float, nargs="+", default=[0.0, 4.0, 16.0, 64.0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[65536, 2097152, 8388608, 16777216])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=12)
    args = parser.parse_args()
    if 0.0 not in args.gaps_ms:
        parser.error("--gaps-ms must include 0 (back to back), the reference of the extra")
    times: dict[tuple[float, int], list[float]] = {}
    for _ in range(args.rounds):
        for gap in args.gaps_ms:
            samples = run_benchmark(
                max_procs=2, sizes=tuple(args.sizes), ops=("all_reduce",), reps=args.reps, calls_per_rep=3,
                warmup=2, timeout_s=600, compute_between_s=gap / 1e3,
            )  # fmt: skip
            for s in samples:
                times.setdefault((gap, s.bytes), []).append(s.seconds * 1e3)
    table = Table(
        title="2-process gloo all-reduce: mean latency after the last arrival (ms), by compute before it"
    )
    table.add_column("bytes", justify="right")
    for gap in args.gaps_ms:
        table.add_column(f"after {gap:g} ms", justify="right")
    for size in sorted(args.sizes):
        base = statistics.median(times[(0.0, size)])
        cells = []
        for gap in args.gaps_ms:
            t = statistics.median(times[(gap, size)])
            cells.append(f"{t:.2f}" if gap == 0 else f"{t:.2f} ({t - base:+.2f})")
        table.add_row(f"{size:,}", *cells)
    Console(width=140).print(table)
    print(
        f"rounds {args.rounds}, {args.reps} timed repetitions of 3 calls per point; (+x): extra over back to back"
    )


if __name__ == "__main__":
    main()
