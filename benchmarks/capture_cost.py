"""What a capture costs: wall time, per-rank iteration time, trace sizes, peak memory.

    .venv/bin/python benchmarks/capture_cost.py [--repeats 3] [--json out.json] [prism-capture model/layout options]

Runs the capture ``--repeats`` times (default: the built-in default slice, target tp=8 pp=16
dp=64) and prints medians. Wall time includes starting each rank process (importing torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.schemas.manifest import CaptureFiles
from prism.schemas.workload import INT_FIELDS, GPTConfig


def parse_args() -> tuple[argparse.Namespace, GPTConfig]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="also write the records here")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--real", choices=[m.value for m in RealMode], default=RealMode.ROLES.value)
    defaults = GPTConfig()
    for name in INT_FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    args = parser.parse_args()
    return args, GPTConfig(**{f: getattr(args, f) for f in INT_FIELDS})


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
    table = Table(title=f"capture cost, {config.layout}, median of {args.repeats}")
    for column in ("rank", "role", "rank wall s", "iter ms", "kineto (gz)", "ET", "comm log", "peak RSS"):
        table.add_column(column, justify="right")
    for r in records:
        table.add_row(
            str(r["rank"]), r["role"], f"{r['rank_wall_s']:.1f}", f"{r['iter_ms']:.1f}",
            f"{r['kineto_bytes'] / 2**20:.2f} MiB", f"{r['et_bytes'] / 2**20:.2f} MiB",
            f"{r['comm_bytes'] / 2**10:.0f} KiB", f"{r['peak_rss_bytes'] / 2**20:.0f} MiB",
        )  # fmt: skip
    table.caption = f"capture wall time (median): {records[0]['capture_wall_s']:.1f} s"
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"config": config.to_dict(), "records": records}, indent=1))


if __name__ == "__main__":
    main()
