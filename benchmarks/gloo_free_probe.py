"""Do CPU traces see every free of a gloo collective's payload? (They do not: see docs/fidelity.md.)

Two processes run ``x = a @ b; all_reduce(x); y = x + 1`` ``--calls`` times under the profiler
with memory events, and rank 0 counts the ``[memory]`` events of its trace. Every iteration
allocates and frees the same blocks, so a complete trace has as many frees as allocations and
ends at the Total Allocated it started from. A free that runs on gloo's worker thread (its Work
dropping the last reference after the main thread moved on) is not recorded.

    .venv/bin/python benchmarks/gloo_free_probe.py [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._C._profiler import _ExperimentalConfig
from torch.profiler import ProfilerActivity, profile

from prism.capture.launch import free_port


def _rank(rank: int, port: int, calls: int, all_threads: bool, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    a, b = torch.randn(128, 256), torch.randn(256, 128)
    config = _ExperimentalConfig(profile_all_threads=all_threads)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, experimental_config=config) as prof:
        for _ in range(calls):
            x = a @ b
            dist.all_reduce(x)
            y = x + 1
            del x, y
    if rank == 0:
        prof.export_chrome_trace(out)
    dist.destroy_process_group()


def probe(calls: int, all_threads: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.json")
        mp.spawn(_rank, args=(free_port(), calls, all_threads, out), nprocs=2)
        events = [e for e in json.loads(Path(out).read_text())["traceEvents"] if e.get("name") == "[memory]"]
    totals = [e["args"]["Total Allocated"] for e in events]
    return {
        "profile_all_threads": all_threads,
        "calls": calls,
        "allocs": sum(e["args"]["Bytes"] > 0 for e in events),
        "frees": sum(e["args"]["Bytes"] < 0 for e in events),
        "final_total_allocated": totals[-1] if totals else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    for all_threads in (False, True):
        print(probe(args.calls, all_threads))


if __name__ == "__main__":
    main()
