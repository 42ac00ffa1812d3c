"""Does a rank's compute slow down when it pauses between chunks (a gloo wait, a sleep)?

    .venv/bin/python benchmarks/compute_after_wait.py [--rounds 3] [--chunks 1500] [--matmuls 2] \
        [--pause-ms 1.5] [--json out.json]

Two gloo processes (one thread each, as the fidelity cases run) repeat a compute chunk
(``--matmuls`` 128x256 @ 256x1024 matmuls, about the tp block of the hidden=256 case) and,
between chunks, one of:

- ``none``: nothing, the next chunk at once (a slice capture's free-running virtual call);
- ``gloo``: a real 64 KiB all-reduce between the two (the fully real run);
- ``sleep``: ``time.sleep(pause)``, the CPU left idle;
- ``spin``: a busy loop of ``pause``, the CPU kept.

It prints rank 0's median chunk time per mode and its ratio to ``none``: how much longer the
same compute takes when the rank has waited before it. The fidelity runs of 2026-11-23 found
real ranks computing 1.0-1.4x as long as their slices; this isolates that effect.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

from prism.capture.launch import free_port

MODES = ("none", "gloo", "sleep", "spin")
console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all modes (interleaved)")
    parser.add_argument(
        "--chunks", type=int, default=1500, help="compute chunks per run (first 10 %% dropped)"
    )
    parser.add_argument("--matmuls", type=int, default=2, help="matmuls per compute chunk")
    parser.add_argument("--pause-ms", type=float, default=1.5, help="sleep / spin between chunks")
    parser.add_argument("--json", type=Path, default=None, help="also write the medians here")
    return parser.parse_args(argv)


def _worker(rank: int, port: int, mode: str, args: argparse.Namespace, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    a, b, x = torch.randn(128, 256), torch.randn(256, 1024), torch.zeros(16384)
    pause_s, chunks = args.pause_ms / 1e3, []
    for _ in range(args.chunks):
        start = time.perf_counter_ns()
        for _ in range(args.matmuls):
            (a @ b).relu_()
        chunks.append(time.perf_counter_ns() - start)
        if mode == "gloo":
            dist.all_reduce(x)
        elif mode == "sleep":
            time.sleep(pause_s)
        elif mode == "spin":
            end = time.perf_counter() + pause_s
            while time.perf_counter() < end:
                pass
    dist.barrier()
    if rank == 0:
        out.put(statistics.median(chunks[len(chunks) // 10 :]) / 1e3)
    dist.destroy_process_group()


def run_mode(mode: str, args: argparse.Namespace) -> float:
    """Rank 0's median compute chunk (µs) with ``mode`` between chunks."""
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, mode, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    if any(p.exitcode != 0 for p in procs):
        for p in procs:
            p.kill()
        raise RuntimeError(f"mode {mode}: a process failed (exit codes {[p.exitcode for p in procs]})")
    return queue.get(timeout=10)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rounds < 1 or args.chunks < 10 or args.matmuls < 1 or args.pause_ms < 0:
        console.print("[bold red]error:[/] rounds ≥ 1, chunks ≥ 10, matmuls ≥ 1, pause-ms ≥ 0")
        return 2
    medians: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            medians[mode].append(run_mode(mode, args))
            console.print(f"round {r + 1}/{args.rounds} {mode}: {medians[mode][-1]:.0f} µs", highlight=False)
    table = Table(title=f"compute chunk, rank 0 (median per run; {args.matmuls} matmuls per chunk)")
    for column in ("between chunks", "chunk µs per round", "median µs", "vs none"):
        table.add_column(column, justify="left" if column == "between chunks" else "right")
    base = statistics.median(medians["none"])
    for mode, values in medians.items():
        table.add_row(
            mode, " / ".join(f"{v:.0f}" for v in values), f"{statistics.median(values):.0f}",
            f"{statistics.median(values) / base:.2f}",
        )  # fmt: skip
    console.print(table)
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "medians_us": medians})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
