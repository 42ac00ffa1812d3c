"""Where a pipeline's transfer time goes: the two posts, the receiver's own work, its wait.

    .venv/bin/python benchmarks/p2p_posts.py RUN_DIR [RUN_DIR ...] [--slice DIR ...] [--cluster SPEC] \
        [--json out.json]

RUN_DIR: a run whose ranks were all real and logged their calls (a ``prism-capture --real all``
directory, or the ``real`` directory of a ``benchmarks/fidelity.py --work-dir`` case); its clean
unprofiled iterations are read. For each direction of transfer and whether the receiver posted
last, the median over transfers of: each end's post (``isend``/``irecv`` entry to return, host
work the graph keeps as a node after the call), the receiver's completion after the later post
began (what a latency table reports), and what of that it spent blocked in its wait (the rest
is its own work between posting and waiting). With ``--cluster`` the comm model's price of the
transfer is printed beside them.

A second table gives every post by rank and direction, of the real runs and of each ``--slice``
(a capture whose peers were virtual: the ``slice`` directory of a fidelity case): the median
post and the posts' time per clean iteration. A slice's graph keeps its virtual posts' time, so
where a real post costs more the simulation's time between blocks comes out short.
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

from prism.graph.comm.call_latency import capture_logs, post_times, transfer_times
from prism.peers.comm_model import CommModel
from prism.schemas.cluster import ClusterSpec
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import MANIFEST_FILE, read_manifest


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


def summarize_posts(run_dirs: list[Path]) -> list[dict]:
    """One row per (run, rank, op, peer, bytes): the posts' count, median (µs) and time per clean
    iteration (ms), of whichever calls the run made, real or virtual."""
    rows = []
    for run in run_dirs:
        job = read_manifest(run).job
        iterations = len(clean_unprofiled(range(job.warmup + job.iterations), job.warmup))
        groups = defaultdict(list)
        for p in post_times(capture_logs(run)):
            groups[(p.rank, p.op, p.peer, p.bytes, p.delegated)].append(p.post_ns)
        for (rank, op, peer, nbytes, delegated), posts in sorted(groups.items()):
            rows.append({
                "run": str(run), "rank": rank, "post": f"{op} {'to' if op == 'send' else 'from'} {peer}",
                "bytes": nbytes, "peer_is": "real" if delegated else "virtual", "posts": len(posts),
                "median_us": round(statistics.median(posts) / 1e3, 1),
                "per_iteration_ms": round(sum(posts) / iterations / 1e6, 3),
            })  # fmt: skip
    # A slice's posts beside the real run's of the same repeat, rank by rank.
    rows.sort(key=lambda r: (str(Path(r["run"]).parent), r["rank"], r["post"], r["bytes"], r["peer_is"]))
    return rows


def compare_posts(posts: list[dict]) -> list[dict]:
    """Per rank of each repeat holding both a real run and a slice (a fidelity case's
    ``repeat<i>/real`` and ``repeat<i>/slice``): the posts' time per clean iteration of each side,
    and the virtual posts' shortfall."""
    totals: dict[tuple[str, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in posts:
        totals[(str(Path(row["run"]).parent), row["rank"])][row["peer_is"]] += row["per_iteration_ms"]
    return [
        {"run": run, "rank": rank, "real_ms": round(t["real"], 3), "virtual_ms": round(t["virtual"], 3),
         "virtual_minus_real_ms": round(t["virtual"] - t["real"], 3)}
        for (run, rank), t in sorted(totals.items()) if "real" in t and "virtual" in t
    ]  # fmt: skip


def _table(title: str, rows: list[dict], columns: list[str]) -> Table:
    table = Table(title=title)
    for column in columns:
        unit = next((u for suffix, u in (("_us", " µs"), ("_ms", " ms")) if column.endswith(suffix)), "")
        table.add_column(column.removesuffix("_us").removesuffix("_ms") + unit, justify="right")
    for row in rows:
        table.add_row(*(_label(row[c]) if c == "run" else str(row[c]) for c in columns))
    return table


def _label(run: str) -> str:
    """A run's last three path parts, the first cut short (a fidelity case's name is long)."""
    *_, case, repeat, side = ("", "", *Path(run).parts)
    return "/".join(p for p in (case[:44], repeat, side) if p)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="directories of runs with every rank real")
    parser.add_argument(
        "--slice", action="append", type=Path, default=[], help="a capture with virtual peers: its posts too"
    )
    parser.add_argument(
        "--cluster", type=Path, default=None, help="cluster spec TOML: print the model's price"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_intermixed_args(argv)  # each run beside its slice
    missing = [
        str(r)
        for r in (*args.runs, *args.slice)
        if not (r / "comm").is_dir() or not (r / MANIFEST_FILE).is_file()
    ]
    if missing:
        print(
            f"not a run whose calls were logged (comm/ and {MANIFEST_FILE}): {', '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    spec = ClusterSpec.load(args.cluster) if args.cluster else None
    rows = summarize(args.runs, spec)
    columns = ["run", "transfer", "bytes", "receiver_last", "transfers", "send_post_us", "recv_post_us",
               "latency_us", "blocked_us"] + (["model_us"] if spec else [])  # fmt: skip
    console = Console(width=200)
    console.print(_table("transfers of runs with every rank real: medians, µs", rows, columns))
    posts = summarize_posts([*args.runs, *args.slice])
    columns = ["run", "rank", "post", "bytes", "peer_is", "posts", "median_us", "per_iteration_ms"]
    console.print(_table("every post, real and virtual: clean unprofiled iterations", posts, columns))
    compared = compare_posts(posts)
    if compared:
        columns = ["run", "rank", "real_ms", "virtual_ms", "virtual_minus_real_ms"]
        console.print(_table("posts per clean iteration, each rank real and in its slice", compared, columns))
    if args.json:
        args.json.write_text(json.dumps({"transfers": rows, "posts": posts, "compared": compared}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
