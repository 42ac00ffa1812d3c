"""Does compute run slower right after its process waited than when it ran back to back?

    .venv/bin/python benchmarks/compute_after_idle.py [--repeats 200] [--hidden 128] [--tokens 128]

A pipeline stage computes after waiting for its neighbour; a slice capture's rank mostly computes
back to back. This times one unit of compute (a transformer-sized MLP's forward and backward,
one thread) right after the process was idle for a gap (slept, or blocked on a pipe as a
receive blocks) or kept busy for it (spun), then the unit after it, against units run back to
back. Conditions are interleaved round by round, so that the machine's slow spells fall on all of
them. With ``--neighbour`` a second process computes the same unit without pause throughout, as
a pipeline's other stage does. Prints each condition's median and mean, in µs and against back
to back.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time

import torch

from prism.graph.comm.wake_bench import mlp_forward

GAPS_MS = (1.0, 5.0, 20.0)


def _unit(hidden: int, tokens: int):
    forward = mlp_forward(tokens, hidden)
    return lambda: forward().backward()


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _neighbour(hidden: int, tokens: int, stop) -> None:
    torch.set_num_threads(1)
    run = _unit(hidden, tokens)
    while not stop.is_set():
        run()


def _timed(run) -> float:
    t = time.perf_counter_ns()
    run()
    return (time.perf_counter_ns() - t) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--neighbour", action="store_true", help="a second process computes throughout")
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = _unit(args.hidden, args.tokens)
    for _ in range(50):
        run()
    reader, writer = os.pipe()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    neighbour = (
        ctx.Process(target=_neighbour, args=(args.hidden, args.tokens, stop)) if args.neighbour else None
    )
    if neighbour is not None:
        neighbour.start()
        time.sleep(2)

    def blocked(seconds: float) -> None:
        # Another thread writes after the gap; this one blocks in read, as a receive blocks.
        threading.Timer(seconds, os.write, (writer, b"x")).start()
        os.read(reader, 1)

    waits = {"slept": time.sleep, "blocked": blocked, "spun": _busy}
    times: dict[str, list[float]] = {"back to back": []}
    for _ in range(args.repeats):
        run()
        times["back to back"].append(_timed(run))
        for gap in GAPS_MS:
            for how, wait in waits.items():
                wait(gap / 1e3)
                first, second = _timed(run), _timed(run)
                times.setdefault(f"after {gap:g} ms {how}", []).append(first)
                times.setdefault(f"  next unit after {gap:g} ms {how}", []).append(second)
    if neighbour is not None:
        stop.set()
        neighbour.join()
    base = statistics.median(times["back to back"])
    print(
        f"unit: MLP forward+backward, {args.tokens} tokens x {args.hidden} hidden, 1 thread; "
        f"{args.repeats} rounds; neighbour computing: {'yes' if args.neighbour else 'no'}"
    )
    print(f"{'condition':34s} {'median µs':>10s} {'mean µs':>10s} {'median vs back to back':>24s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"{name:34s} {median:10.1f} {statistics.mean(values):10.1f} {100 * (median / base - 1):+23.1f}%"
        )


if __name__ == "__main__":
    main()
