"""What the host work of virtual collectives costs the program's thread beyond its CPU share.

    .venv/bin/python benchmarks/host_work_gil.py [--repeats 10] [--iterations 100]

A program thread runs a small MLP's forward and backward (one torch thread, about 10 ms an
iteration here) and, twice an iteration, starts the host work of a gradient bucket
(``prism.peers.host_work.HostWork``, 0.5 ns a byte: 0.5 and 0.25 ms), as a replayed DDP rank
does; a second process runs the same loop without host work on the other core, as the world's
other rank does. Three ways, interleaved over the repeats:

- ``none``: no host work (the baseline);
- ``python loop``: the work as sums of 1 MiB chunks from a Python loop, which takes the
  interpreter lock back after every chunk;
- ``compiled``: ``HostWork`` as it is, one compiled loop that never holds the lock.

Printed: the program's median iteration per repeat, the medians, and each way's lengthening over
``none`` (median of the repeats' paired differences), beside the CPU time of the work asked.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np
import torch

from prism.peers.host_work import HostWork

BUCKETS = (1 << 20, 1 << 19)  # bytes of the two buckets' all-reduces
NS_PER_BYTE = 0.5


class PythonLoopWork(HostWork):
    """The same work from a Python loop of numpy sums, 1 MiB at a time (the reference)."""

    def _do(self, work_ns: int, nbytes: int, until_ns: int | None) -> None:
        began = time.thread_time_ns()
        elements, chunk, at = max(nbytes // 4, 1), 2**18, 0
        while time.thread_time_ns() - began < work_ns and (until_ns is None or time.time_ns() < until_ns):
            end = min(at + chunk, elements)
            np.add(self._a[at:end], self._b[at:end], out=self._b[at:end])
            at = 0 if end == elements else end
        self.done_ns += time.thread_time_ns() - began


WAYS = {"none": None, "python loop": PythonLoopWork, "compiled": HostWork}


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def program(way: str, iterations: int, out: mp.Queue | None = None) -> float:
    """Median iteration (ms) of the program loop with ``way``'s host work."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(24)])
    x = torch.randn(64, 128)
    kind = WAYS[way]
    work = None if kind is None else kind({"all_reduce": NS_PER_BYTE})
    times = []
    for _ in range(iterations):
        began = time.perf_counter_ns()
        _step(model, x)
        if work is not None:
            work.start("all_reduce", BUCKETS[0], None)
        for _ in range(3):
            _step(model, x)
        if work is not None:
            work.start("all_reduce", BUCKETS[1], None)
        _step(model, x)
        times.append(time.perf_counter_ns() - began)
    median = statistics.median(times[5:]) / 1e6
    if out is not None:
        out.put(median)
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results: dict[str, list[float]] = {way: [] for way in WAYS}
    for repeat in range(args.repeats):
        for way in WAYS:
            other = ctx.Process(target=program, args=("none", 100 * args.iterations), daemon=True)
            other.start()
            time.sleep(1.0)  # the other rank is computing before this one starts
            out = ctx.Queue()
            runner = ctx.Process(target=program, args=(way, args.iterations, out))
            runner.start()
            results[way].append(out.get(timeout=600))
            runner.join()
            other.kill()
            other.join()
        print(
            f"repeat {repeat + 1}/{args.repeats}: "
            + ", ".join(f"{w} {v[-1]:.2f} ms" for w, v in results.items())
        )
    base = results["none"]
    print(f"\n{'way':<12} {'median ms':>10} {'lengthening ms':>15}   per repeat (ms)")
    for way, values in results.items():
        extra = statistics.median(v - b for v, b in zip(values, base, strict=True))
        print(
            f"{way:<12} {statistics.median(values):>10.2f} {extra:>+15.2f}   "
            + " ".join(f"{v:.2f}" for v in values)
        )
    work_ms = sum(BUCKETS) * NS_PER_BYTE / 1e6
    print(f"host work asked: {work_ms:.2f} ms of CPU an iteration")


if __name__ == "__main__":
    main()
