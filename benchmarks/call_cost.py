"""The whole cost to the program of one virtual call through prism's process group.

    .venv/bin/python benchmarks/call_cost.py [--calls 2000] [--repeats 5]

A capture's or a replay's program pays, for every call on a group with virtual members, the
process group's own Python: logging the call, marking it for the profiler, building its Work,
asking the clock and completing the call. A plain gloo or NCCL run pays none of it. This times
``dist.all_reduce`` of 4 KiB, ``dist.all_gather_into_tensor`` and ``dist.send`` of 4 KiB on a world
of two whose other rank is virtual, under a clock that completes every call at once (so the
time is the process group's, not a modelled wait), profiler off, as in the unprofiled
iterations that time a job. Each call back to back, and after a GPT-like block of compute (a
128x256 @ 256x512 matmul and a GELU) that leaves the interpreter's caches as a program does;
conditions alternate repeat by repeat. Prints the median µs a call (``benchmarks/clock_cost.py``
times a replay's clock alone).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate
from prism.peers.clock import FreeRunningClock


def _calls() -> dict[str, Callable[[], None]]:
    data, gathered = torch.ones(1024), torch.empty(2048)
    return {
        "all_reduce 4 KiB": lambda: dist.all_reduce(data),
        "all_gather 4 KiB": lambda: dist.all_gather_into_tensor(gathered, data),
        "send 4 KiB": lambda: dist.send(data, dst=1),
    }


def _compute() -> Callable[[], None]:
    x, w = torch.randn(128, 256), torch.randn(256, 512)
    return lambda: torch.nn.functional.gelu(x @ w)


def _per_call_us(call: Callable[[], None], calls: int, between: Callable[[], None] | None) -> float:
    spent = 0
    for _ in range(calls):
        if between is not None:
            between()
        began = time.perf_counter_ns()
        call()
        spent += time.perf_counter_ns() - began
    return spent / calls / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor, as FSDP2 calls it
    activate(VirtualWorld(real_ranks=frozenset({0}), clock=FreeRunningClock(), labeler=lambda ranks: None))
    dist.init_process_group(BACKEND_NAME, rank=0, world_size=2, store=dist.HashStore())
    calls, compute = _calls(), _compute()
    conditions = [(name, between) for name in calls for between in ("nothing", "GPT-like compute")]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in conditions}
    for _ in range(args.repeats + 1):  # the first round warms up and is dropped
        for name, between in conditions:
            us = _per_call_us(calls[name], args.calls, compute if between != "nothing" else None)
            times[(name, between)].append(us)
    table = Table(title="a virtual call's cost to the program (µs, median over repeats)")
    for column in ("call", "between calls", "µs per call"):
        table.add_column(column, justify="right")
    for (name, between), values in times.items():
        table.add_row(name, between, f"{statistics.median(values[1:]):.2f}")
    Console(width=100).print(table)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
