"""What a gloo all-reduce costs while its members compute, against the same call with them idle.

    .venv/bin/python benchmarks/overlap_calls.py [--sizes 65536 524288 1048576 8388608] [--rounds 30]
                                                 [--span-ms 20] [--json FILE]

DDP issues its bucket all-reduces from backward and goes on computing; on a CPU test bed the
call's ring steps then run on gloo's threads beside both ranks' compute. Two processes (one
torch thread each, as the fidelity runs' ranks) time, round after round, each size two ways:
**idle**, the call issued and waited on at once (as ``prism-calibrate`` times it); and
**computing**, the call issued and the member then running matmuls for ``--span-ms``, polling
the call between them (a matmul is 10-20 µs, the poll's resolution). A call's latency runs
from the later member's issue to its completion as the member saw it, mean over members. Also
per size: the members' matmul rate while the call is in flight against a span with no call
(1.0: the call takes nothing from the compute). Printed: per size, the mean and median of each
way over rounds, and the ratio of the means.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from prism.capture.launch import free_port

CHUNK = 48
"""Side of the square matmul the members compute in: 10-20 µs each here."""


def _compute_until(deadline_ns: int, a, work=None) -> tuple[int, int, int]:
    """Matmuls until ``deadline_ns``; returns (matmuls, when ``work`` was first seen complete (0:
    not before the deadline), matmuls done before that)."""
    import torch

    done_ns, n, n_during = 0, 0, 0
    while time.monotonic_ns() < deadline_ns:
        torch.mm(a, a)
        n += 1
        if work is not None and not done_ns and work.is_completed():
            done_ns, n_during = time.monotonic_ns(), n
    return n, done_ns, n_during


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=600)
    )
    a = torch.randn(CHUNK, CHUNK)
    span_ns = int(args.span_ms * 1e6)
    tensors = {n: torch.zeros(n // 4) for n in args.sizes}
    rows = []  # (round, bytes, way, issue_ns, done_ns, matmuls in flight, ns in flight)
    for rnd in range(args.warmup + args.rounds):
        for n in args.sizes:
            for way in ("idle", "computing", "no call"):
                dist.barrier()
                issue = time.monotonic_ns()
                if way == "no call":
                    count, _, _ = _compute_until(issue + span_ns, a)
                    rows.append((rnd, n, way, issue, issue + span_ns, count, span_ns))
                    continue
                work = dist.all_reduce(tensors[n], async_op=True)
                if way == "idle":
                    work.wait()
                    rows.append((rnd, n, way, issue, time.monotonic_ns(), 0, 0))
                    continue
                count, done, during = _compute_until(issue + span_ns, a, work)
                work.wait()
                if not done:  # still in flight after the span: every matmul of it ran beside the call
                    done, during = time.monotonic_ns(), count
                rows.append((rnd, n, way, issue, done, during, min(done, issue + span_ns) - issue))
    everyone = [None, None]
    dist.all_gather_object(everyone, [r for r in rows if r[0] >= args.warmup])
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.barrier()
    dist.destroy_process_group()


def _summarise(members: list[list]) -> dict[int, dict[str, float]]:
    """Per size: each way's latency after the later issue (mean over members), mean and median
    over rounds (ms), and the matmul rate in flight over the rate with no call."""
    out: dict[int, dict[str, float]] = {}
    for i, row0 in enumerate(members[0]):
        _, n, way, *_ = row0
        rows = [m[i] for m in members]
        stats = out.setdefault(n, {"idle": [], "computing": [], "rate": [], "alone": []})
        last_issue = max(r[3] for r in rows)
        if way == "no call":
            stats["alone"] += [r[5] / r[6] for r in rows]
            continue
        stats[way].append(statistics.fmean(r[4] - last_issue for r in rows) / 1e6)
        if way == "computing":
            stats["rate"] += [r[5] / r[6] for r in rows if r[6] > 0]
    summary = {}
    for n, s in sorted(out.items()):
        alone = statistics.fmean(s["alone"])
        summary[n] = {
            "idle_mean_ms": statistics.fmean(s["idle"]),
            "idle_median_ms": statistics.median(s["idle"]),
            "computing_mean_ms": statistics.fmean(s["computing"]),
            "computing_median_ms": statistics.median(s["computing"]),
            "compute_rate_in_flight": statistics.fmean(s["rate"]) / alone,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[65536, 524288, 1048576, 8388608])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--span-ms", type=float, default=20.0)
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    if any(n <= 0 or n % 4 for n in args.sizes):
        parser.error("--sizes are bytes of float32 tensors: positive multiples of 4")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        mp.start_processes(_worker, args=(free_port(), args, out), nprocs=2, start_method="spawn")
        summary = _summarise(json.loads(Path(out).read_text()))
    table = Table(
        title="2-process gloo all-reduce: latency after the later issue (ms), mean / median over rounds"
    )
    for name in ("bytes", "members idle", "members computing", "ratio of means", "compute rate in flight"):
        table.add_column(name, justify="right")
    for n, s in summary.items():
        table.add_row(
            f"{n:,}",
            f"{s['idle_mean_ms']:.2f} / {s['idle_median_ms']:.2f}",
            f"{s['computing_mean_ms']:.2f} / {s['computing_median_ms']:.2f}",
            f"{s['computing_mean_ms'] / s['idle_mean_ms']:.2f}",
            f"{s['compute_rate_in_flight']:.2f}",
        )
    Console(width=140).print(table)
    print(
        f"{args.rounds} rounds ({args.warmup} more untimed), each size idle, computing for {args.span_ms:g} ms "
        f"and computing with no call, in turn; a {CHUNK}x{CHUNK} matmul between polls"
    )
    if args.json:
        args.json.write_text(json.dumps({str(n): s for n, s in summary.items()}, indent=2))


if __name__ == "__main__":
    main()
