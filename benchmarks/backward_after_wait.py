"""Does a pipeline stage's backward run slower after it waited for its neighbour, and for how long?

    .venv/bin/python benchmarks/backward_after_wait.py [--tokens 128] [--hidden 128] [--rounds 60]

The spec's ``wake_compute`` table (``prism.graph.comm.wake_bench``) times ~1 ms units right after
a wait. A first pipeline stage runs a forward, other work, then blocks until the next stage
sends its gradient, and runs the backward of that forward. Two gloo processes: rank 0 does
exactly that against the same sequence without the wait (back to back), its neighbour computing
the same MLP block's forward and backward throughout; then it times the next unit of work, to
show whether the slowdown outlasts the backward. Conditions are interleaved round by round.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

from prism.graph.comm.wake_bench import give_order, mlp_forward, next_order

GAPS_MS = (1.0, 4.0, 16.0)


def _neighbour(order, port: int, tokens: int, hidden: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=1, world_size=2)
    forward, answer, seen = mlp_forward(tokens, hidden), torch.zeros(1), 0.0
    while True:
        seen, seconds = next_order(order, seen, lambda: forward().backward())
        if seconds < 0:
            break
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            forward().backward()
        dist.send(answer, dst=0)
    dist.barrier()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.utils.distributed import get_free_port

    torch.set_num_threads(1)
    port, ctx = get_free_port(), mp.get_context("spawn")
    order = ctx.Array("d", [0.0, 0.0])
    neighbour = ctx.Process(target=_neighbour, args=(order, port, args.tokens, args.hidden))
    neighbour.start()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=2)
    forward, answer = mlp_forward(args.tokens, args.hidden), torch.zeros(1)
    for _ in range(10):
        forward().backward()
    times: dict[float, list[tuple[int, int]]] = {}
    for _ in range(args.rounds):
        for gap_ms in (0.0, *GAPS_MS):
            loss = forward()
            forward().backward()  # the stage's other work between a forward and its backward
            if gap_ms:
                give_order(order, gap_ms / 1e3)
                dist.recv(answer, src=1)
            t = time.perf_counter_ns()
            loss.backward()
            backward = time.perf_counter_ns() - t
            t = time.perf_counter_ns()
            forward().backward()
            times.setdefault(gap_ms, []).append((backward, time.perf_counter_ns() - t))
    give_order(order, -1.0)
    dist.barrier()
    neighbour.join()
    base = [statistics.median(t[k] for t in times[0.0]) for k in (0, 1)]
    print(
        f"MLP block, {args.tokens} tokens x {args.hidden} hidden, 1 thread, {args.rounds} rounds, neighbour computing"
    )
    print(f"back to back: backward {base[0] / 1e3:.0f} µs, next unit {base[1] / 1e3:.0f} µs (medians)")
    print(f"{'wait':>8s} {'backward':>22s} {'next unit':>22s}")
    for gap_ms in GAPS_MS:
        cells = []
        for k in (0, 1):
            median = statistics.median(t[k] for t in times[gap_ms])
            cells.append(f"{100 * (median / base[k] - 1):+6.1f}% ({(median - base[k]) / 1e3:+6.0f} µs)")
        print(f"{gap_ms:6.1f} ms {cells[0]:>22s} {cells[1]:>22s}")


if __name__ == "__main__":
    main()
