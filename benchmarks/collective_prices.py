"""A program's real collectives beside the prices its graph gives them, call size by call size.

    .venv/bin/python benchmarks/collective_prices.py REAL_CAPTURE GRAPH [--rank R] [--json out.json]

REAL_CAPTURE: a ``prism-capture --real all`` directory of the program (every rank real, each call
logged); its clean unprofiled iterations are read. GRAPH: the graph of a slice capture of the
same program at the same layout (``prism-build-graph``). For each collective (op, bytes, group
size): the calls an iteration makes on each side; what a real rank paid per call (entry to
completion, the wait for later members included) and the call's latency after its last member
arrived (what the comm model prices; median and mean); the graph's price per call of rank R
(each node's duration: the α-β price, its cold latency after the compute before it, and its
busy price where it flies beside compute); and the graph's time in those calls an iteration
beside the real one, so that a layout whose communication is priced long or short shows which
calls carry it.
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

from prism.graph.comm.call_latency import call_latencies, capture_logs, real_calls
from prism.graph.io.parquet import read_rank
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import NodeKind
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import read_manifest

console = Console(width=max(120, Console().width))
Key = tuple[str, int, int]


def real_call_times(capture: Path) -> dict[Key, dict]:
    """Per (op, bytes, group size): calls an iteration (mean over ranks), each rank's entry to
    completion (ms, mean over calls), and the latency after the last member's arrival."""
    job = read_manifest(capture).job
    clean = len(clean_unprofiled(list(range(job.warmup + job.iterations)), job.warmup))
    logs = capture_logs(capture)
    paid: dict[Key, list[int]] = defaultdict(list)
    for c, transfer in real_calls(logs):
        if transfer is None:  # a collective
            paid[(c.op, c.bytes, c.group_size)].append(c.done_ns - c.enter_ns)
    latency: dict[Key, list[int]] = defaultdict(list)
    for c in call_latencies(logs):
        if c.op != "send":
            latency[(c.op, c.bytes, c.group_size)].append(c.latency_ns)
    return {
        key: {
            "calls_per_iter": len(durations) / len(logs) / clean,
            "paid_ms": statistics.mean(durations) / 1e6,
            "latency_median_ms": statistics.median(latency[key]) / 1e6 if latency[key] else None,
            "latency_mean_ms": statistics.mean(latency[key]) / 1e6 if latency[key] else None,
        }
        for key, durations in paid.items()
    }


def graph_prices(graph: Path, rank: int) -> dict[Key, dict]:
    """Per (op, bytes, group size): rank ``rank``'s calls in its graph iteration and their mean price."""
    nodes = read_rank(graph, rank, columns=[gf.KIND, gf.NAME, gf.BYTES, gf.GROUP_SIZE, gf.DUR_NS]).to_pandas()
    calls = nodes[nodes[gf.KIND].astype(str) == NodeKind.COLLECTIVE.value]
    return {
        (str(op), int(nbytes), int(size)): {
            "calls_per_iter": len(group),
            "price_ms": group[gf.DUR_NS].mean() / 1e6,
        }
        for (op, nbytes, size), group in calls.groupby([gf.NAME, gf.BYTES, gf.GROUP_SIZE], observed=True)
    }


def rows(real: dict[Key, dict], graph: dict[Key, dict]) -> list[dict]:
    out = []
    for key in sorted(set(real) | set(graph), key=lambda k: (k[0], k[1], k[2])):
        r, g = real.get(key, {}), graph.get(key, {})
        row = {"op": key[0], "bytes": key[1], "group_size": key[2], **r}
        row["graph_calls_per_iter"] = g.get("calls_per_iter")
        row["graph_price_ms"] = g.get("price_ms")
        if r.get("latency_mean_ms") is not None and g:
            row["graph_ms_per_iter"] = g["calls_per_iter"] * g["price_ms"]
            row["real_ms_per_iter"] = r["calls_per_iter"] * r["latency_mean_ms"]
        out.append(row)
    return out


def table(found: list[dict]) -> Table:
    t = Table(title="collectives: real calls (every rank real) beside the graph's prices")
    columns = (
        "op", "bytes", "size", "calls/iter real", "calls/iter graph", "real paid ms", "real latency ms (median / mean)",
        "graph price ms", "ms/iter real / graph",
    )  # fmt: skip
    for column in columns:
        t.add_column(column, justify="left" if column == "op" else "right")

    def ms(v: float | None) -> str:
        return "" if v is None else f"{v:.3f}"

    for r in found:
        per_iter = (
            f"{r['real_ms_per_iter']:.1f} / {r['graph_ms_per_iter']:.1f}" if "graph_ms_per_iter" in r else ""
        )
        t.add_row(
            r["op"], str(r["bytes"]), str(r["group_size"]),
            "" if "calls_per_iter" not in r else f"{r['calls_per_iter']:.1f}",
            "" if r["graph_calls_per_iter"] is None else str(r["graph_calls_per_iter"]),
            ms(r.get("paid_ms")), f"{ms(r.get('latency_median_ms'))} / {ms(r.get('latency_mean_ms'))}",
            ms(r["graph_price_ms"]), per_iter,
        )  # fmt: skip
    t.caption = (
        "real paid: a rank's call from entry to completion, the wait for later members included; real latency: "
        "after the last member arrived (what the graph prices; the graph models arrival skew apart); graph price: "
        "the node's duration; ms/iter: calls an iteration x mean latency, and x the graph's price"
    )
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("real_capture", type=Path, help="a prism-capture --real all directory")
    parser.add_argument("graph", type=Path, help="the graph of a slice capture at the same layout")
    parser.add_argument("--rank", type=int, default=0, help="the graph rank whose calls are priced")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        found = rows(real_call_times(args.real_capture), graph_prices(args.graph, args.rank))
    except (FileNotFoundError, ValueError) as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False)
        return 2
    console.print(table(found))
    if args.json:
        args.json.write_text(json.dumps({"rows": found}, indent=1))
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
