"""What a small gloo collective costs a CPU training step here, by the rhythm it is called in.

    .venv/bin/python benchmarks/gloo_rhythm.py [--bytes 16384 1048576] [--blocks 12]

Two processes (torchrun-like, gloo on localhost, one intra-op thread each) run, block after
block, three loops of all-reduces of each size, interleaved so that the machine's slow spells
fall on all of them:

- *step*: a block of GPT-like compute (LayerNorm, MLP, residual; about 150 µs on this VM), then
  the all-reduce, as a tensor-parallel layer calls it;
- *spin*: 300 µs of busy-waiting instead of the compute (prism-calibrate's cold calls);
- *barrier*: a barrier, then three calls back to back (prism-calibrate's default).

Each call's latency after the last member arrived (as prism-calibrate and the comm model time
it), median, mean and p90 over both members; and for *step*, how long the compute block took
after the all-reduce against the same block run back to back with no call between (the
compute a blocking call leaves slower behind it). A tensor-parallel step of small layers is
mostly these two numbers, which the comm model prices from one rhythm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table

MODES = ("step", "spin", "barrier")


def _worker(rank: int, port: int, sizes: list[int], blocks: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.LayerNorm(64), torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
    )
    x = torch.randn(64, 64, requires_grad=True)

    def compute() -> None:
        y = x
        for _ in range(2):
            y = block(y) + y

    def spin(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    latency = {(m, n): [] for m in MODES for n in sizes}
    after_call, back_to_back = [], []
    for b in range(blocks):
        keep = b >= 2  # the first blocks warm up
        for n in sizes:
            buf = torch.zeros(n // 4)
            for mode in MODES:
                stamps = []
                dist.barrier()
                if mode == "barrier":
                    for _ in range(40):
                        dist.barrier()
                        for _ in range(3):
                            t = time.monotonic_ns()
                            dist.all_reduce(buf)
                            stamps.append((t, time.monotonic_ns()))
                else:
                    for _ in range(120):
                        t0 = time.perf_counter_ns()
                        compute() if mode == "step" else spin(300e-6)
                        if mode == "step" and keep and stamps:
                            after_call.append(time.perf_counter_ns() - t0)
                        t = time.monotonic_ns()
                        dist.all_reduce(buf)
                        stamps.append((t, time.monotonic_ns()))
                mine = torch.tensor(stamps)
                both = [torch.zeros_like(mine) for _ in range(2)]
                dist.all_gather(both, mine)
                last = torch.maximum(both[0][:, 0], both[1][:, 0])
                if keep:
                    for member in both:
                        latency[(mode, n)] += ((member[:, 1] - last).double() / 1e3).tolist()
        for _ in range(120):  # the same compute with no call between
            t0 = time.perf_counter_ns()
            compute()
            if keep:
                back_to_back.append(time.perf_counter_ns() - t0)
    if rank == 0:
        rows = [(m, n, v) for (m, n), v in latency.items()]
        torch.save({"latency": rows, "after_call": after_call, "back_to_back": back_to_back}, out)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, nargs="+", default=[16384, 1048576])
    parser.add_argument("--blocks", type=int, default=12, help="interleaved blocks (the first two warm up)")
    args = parser.parse_args()
    if args.blocks < 3 or min(args.bytes) < 4:
        sys.exit("error: --blocks must be 3 or more and --bytes at least 4")
    from torch.distributed.elastic.utils.distributed import get_free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.pt")
        mp.spawn(_worker, args=(get_free_port(), args.bytes, args.blocks, out), nprocs=2, join=True)
        import torch

        result = torch.load(out, weights_only=True)
    table = Table(title=f"gloo all-reduce between 2 processes, by rhythm ({os.cpu_count()} CPUs)")
    for column in ("rhythm", "bytes", "calls", "latency µs median", "mean", "p90"):
        table.add_column(column, justify="right")
    for mode, n, values in result["latency"]:
        values = sorted(values)
        table.add_row(
            mode, f"{n:,}", str(len(values)), f"{statistics.median(values):.0f}", f"{statistics.fmean(values):.0f}",
            f"{values[int(0.9 * len(values))]:.0f}",
        )  # fmt: skip
    console = Console(width=120)
    console.print(table)
    after, alone = (statistics.median(result[k]) / 1e3 for k in ("after_call", "back_to_back"))
    console.print(
        f"GPT-like compute block: {alone:.0f} µs back to back, {after:.0f} µs right after an all-reduce "
        f"({100 * (after / alone - 1):+.0f} %), medians of {len(result['back_to_back'])} and {len(result['after_call'])}"
    )


if __name__ == "__main__":
    main()
