"""What a capture costs: wall time, per-rank iteration time, trace sizes, peak memory, and the
cost of the block timer that gives the graph its unprofiled times.

    .venv/bin/python benchmarks/capture_cost.py [--repeats 3] [--json out.json] [prism-capture model/layout options]

Runs the capture ``--repeats`` times (default: the built-in default slice, target tp=8 pp=16
dp=64) and prints medians. Wall time includes starting each rank process (importing torch).

The block timer (``prism.capture.phase_timer``) times every top-level block of every iteration,
profiled or not, and sits inside the iterations it measures. Its cost per block is timed here,
in this process (marks opened and closed with the timer on, less the same with it off), and
multiplied by each captured rank's top-level blocks in an iteration (its first profiled one):
the time it adds to an unprofiled iteration, also as a share of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.capture import annotate
from prism.capture.phase_timer import PhaseTimer
from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.capture.workloads.gpt.config import INT_FIELDS, GPTConfig
from prism.graph.traces.kineto import find_marks, read_kineto
from prism.schemas.annotations import Mark, Phase, is_block
from prism.schemas.iterations import MIN_WARMUP, clean_unprofiled
from prism.schemas.manifest import CaptureFiles


def parse_args() -> tuple[argparse.Namespace, GPTConfig]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    parser.add_argument("--warmup", type=int, default=MIN_WARMUP)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--real", choices=[m.value for m in RealMode], default=RealMode.ROLES.value)
    defaults = GPTConfig()
    for name in INT_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    args = parser.parse_args()
    return args, GPTConfig(**{f: getattr(args, f) for f in INT_FIELDS})


def block_timer_ns(marks: int = 20_000, repeats: int = 7) -> float:
    """What the block timer adds to one top-level block (open and close), ns: median over
    ``repeats`` of the same marks timed with the timer on and off, interleaved."""
    mark = Mark(phase=Phase.FORWARD, stage=0, mb=0)

    def per_mark() -> float:
        began = time.perf_counter_ns()
        for _ in range(marks):
            with annotate.mark(mark):
                pass
        return (time.perf_counter_ns() - began) / marks

    on, off = [], []
    try:
        for _ in range(repeats):
            annotate.set_phase_timer(None)
            off.append(per_mark())
            annotate.set_phase_timer(PhaseTimer())
            on.append(per_mark())
    finally:
        annotate.set_phase_timer(None)
    return statistics.median(on) - statistics.median(off)


def top_level_blocks(kineto: Path) -> int:
    """Top-level block marks in the first profiled iteration of a rank's trace: what the block
    timer times in every iteration."""
    marks = find_marks(read_kineto(kineto))
    first = marks.iterations.iloc[0]
    inside = [
        (s, e) for s, e, m in marks.blocks if is_block(m.phase) and first.start_ns <= s and e <= first.end_ns
    ]
    count, open_until = 0, -1
    for start, end in inside:  # in time order, the outer of nested blocks first
        if start >= open_until:
            count, open_until = count + 1, end
    return count


def measure_once(config: GPTConfig, args: argparse.Namespace) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "capture"
        options = CaptureOptions(
            config=config,
            out_dir=out,
            real=RealMode(args.real),
            warmup=args.warmup,
            iterations=args.iterations,
        )
        manifest = run_capture(options)
        files = CaptureFiles(out)
        return [
            {
                "rank": r.rank,
                "role": r.role.value,
                "capture_wall_s": manifest.wall_s,
                "rank_wall_s": r.result.wall_s,
                "iter_ms": statistics.median(r.result.iteration_ns[-args.iterations :]) / 1e6,
                "kineto_bytes": files.kineto(r.rank).stat().st_size,
                "et_bytes": files.et(r.rank).stat().st_size,
                "comm_bytes": files.comm(r.rank).stat().st_size,
                "peak_rss_bytes": r.result.peak_rss_bytes,
                "blocks": top_level_blocks(files.kineto(r.rank)),
                "unprofiled_ms": statistics.median(
                    clean_unprofiled(r.result.iteration_ns, args.warmup) or [0]
                )
                / 1e6,
            }
            for r in manifest.ranks
        ]


def main() -> None:
    args, config = parse_args()
    runs = [measure_once(config, args) for _ in range(args.repeats)]
    keys = [k for k in runs[0][0] if k not in ("rank", "role")]
    records = [
        {
            "rank": row["rank"],
            "role": row["role"],
            **{k: statistics.median(run[i][k] for run in runs) for k in keys},
        }
        for i, row in enumerate(runs[0])
    ]
    timer_ns = block_timer_ns()
    for r in records:
        r["block_timer_us"] = r["blocks"] * timer_ns / 1e3
    table = Table(title=f"capture cost, {config.layout}, median of {args.repeats}")
    columns = ("rank", "role", "rank wall s", "iter ms (profiled)", "unprofiled ms", "kineto (gz)", "ET",
               "comm log", "peak RSS", "blocks / iter", "block timer µs / iter")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for r in records:
        share = (
            f" ({100 * r['block_timer_us'] / 1e3 / r['unprofiled_ms']:.3f} %)" if r["unprofiled_ms"] else ""
        )
        table.add_row(
            str(r["rank"]), r["role"], f"{r['rank_wall_s']:.1f}", f"{r['iter_ms']:.1f}", f"{r['unprofiled_ms']:.1f}",
            f"{r['kineto_bytes'] / 2**20:.2f} MiB", f"{r['et_bytes'] / 2**20:.2f} MiB",
            f"{r['comm_bytes'] / 2**10:.0f} KiB", f"{r['peak_rss_bytes'] / 2**20:.0f} MiB",
            f"{r['blocks']:.0f}", f"{r['block_timer_us']:.0f}{share}",
        )  # fmt: skip
    table.caption = (
        f"capture wall time (median): {records[0]['capture_wall_s']:.1f} s; block timer: {timer_ns / 1e3:.2f} µs a "
        "block (open and close, timed in this process)"
    )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"config": config.to_dict(), "records": records}, indent=1))


if __name__ == "__main__":
    main()
