"""Where a pipeline's transfer time goes: the two posts, the receiver's own work, its wait.

    .venv/bin/python benchmarks/p2p_posts.py RUN_DIR [RUN_DIR ...] [--cluster SPEC] [--json out.json]

RUN_DIR: a run whose ranks were all real and logged their calls (a ``prism-capture --real all``
directory, or the ``real`` directory of a ``benchmarks/fidelity.py --work-dir`` case); its clean
unprofiled iterations are read. For each direction of transfer and whether the receiver posted
last, the median over transfers of: each end's post (``isend``/``irecv`` entry to return, host
work the graph keeps as a node after the call), the receiver's completion after the later post
began (what a latency table reports), and what of that it spent blocked in its wait (the rest
is its own work between posting and waiting). With ``--cluster`` the comm model's price of the
transfer is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.graph.comm.call_latency import capture_logs, transfer_times
from prism.peers.comm_model import CommModel
from prism.schemas.cluster import ClusterSpec


def summarize(run_dirs: list[Path], spec: ClusterSpec | None) -> list[dict]:
    """One row per (run, direction, receiver last), medians in µs."""
    model = CommModel(spec) if spec is not None else None
    rows = []
    for run in run_dirs:
        groups = defaultdict(list)
        for t in transfer_times(capture_logs(run)):
            groups[(t.source, t.dest, t.bytes, t.receiver_last)].append(t)
        for (source, dest, nbytes, receiver_last), items in sorted(groups.items()):

            def us(field: str, items=items) -> float:
                return round(statistics.median(getattr(t, field) for t in items) / 1e3, 1)

            row = {
                "run": str(run), "transfer": f"{source}->{dest}", "bytes": nbytes,
                "receiver_last": receiver_last, "transfers": len(items), "send_post_us": us("send_post_ns"),
                "recv_post_us": us("recv_post_ns"), "latency_us": us("latency_ns"), "blocked_us": us("blocked_ns"),
            }  # fmt: skip
            if model is not None:
                row["model_us"] = round(model.duration_ns("send", nbytes, 2, 1) / 1e3, 1)
            rows.append(row)
    return rows


def _label(run: str) -> str:
    """A run's last three path parts, the first cut short (a fidelity case's name is long)."""
    *_, case, repeat, side = ("", "", *Path(run).parts)
    return "/".join(p for p in (case[:20], repeat, side) if p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="directories of runs with every rank real")
    parser.add_argument(
        "--cluster", type=Path, default=None, help="cluster spec TOML: print the model's price"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "comm").is_dir()]
    if missing:
        print(f"no comm/ directory (a run whose calls were logged) in: {', '.join(missing)}", file=sys.stderr)
        return 2
    spec = ClusterSpec.load(args.cluster) if args.cluster else None
    rows = summarize(args.runs, spec)
    table = Table(title="transfers of runs with every rank real: medians, µs")
    columns = ["run", "transfer", "bytes", "receiver_last", "transfers", "send_post_us", "recv_post_us",
               "latency_us", "blocked_us"] + (["model_us"] if spec else [])  # fmt: skip
    for column in columns:
        table.add_column(
            column.removesuffix("_us") + (" µs" if column.endswith("_us") else ""), justify="right"
        )
    for row in rows:
        table.add_row(*(_label(row[c]) if c == "run" else str(row[c]) for c in columns))
    Console(width=200).print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
