"""Does a rank compute slower when its neighbour computes in step with it than out of step?

    .venv/bin/python benchmarks/neighbour_step.py [--rounds 20] [--hidden 256] [--gap-ms 9]

Every rank of a small real run on this machine computes at the same moments as the others: a
collective ends for all members at once, so their forward, backward and optimizer steps start
together and their waits fall together. A load-matched slice capture's load ranks run the same
program but free, each holding its own calls, so their waits fall anywhere in the captured rank's
iteration. This times one process's cycle (an MLP's forward and backward, then an Adam step,
then a sleep standing for a collective) while a second process runs the same cycle in step (both
start each cycle at a barrier), out of step (the second sleeps first, so its sleep falls in the
first's compute), or idles. Conditions alternate cycle by cycle. Prints each condition's median
compute and optimizer time, in ms and against in step.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch

CONDITIONS = ("in step", "out of step", "neighbour idle")


def _cycle(hidden: int, tokens: int, layers: int):
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(
            torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(), torch.nn.Linear(4 * hidden, hidden)
        )
        for _ in range(layers)
    ]
    model = torch.nn.Sequential(*blocks)
    optimizer = torch.optim.Adam(model.parameters(), foreach=False)
    x = torch.randn(tokens, hidden)

    def compute() -> None:
        model(x).sum().backward()

    def step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    return compute, step, sum(p.numel() for p in model.parameters())


def _neighbour(args: argparse.Namespace, barrier, order) -> None:
    torch.set_num_threads(1)
    compute, step, _ = _cycle(args.hidden, args.tokens, args.layers)
    gap = args.gap_ms / 1e3
    for condition in order:
        barrier.wait()
        if condition == "in step":
            compute()
            step()
            time.sleep(gap)
        elif condition == "out of step":
            time.sleep(gap)
            compute()
            step()
        barrier.wait()  # the cycle's end: the next condition starts from both ranks' barrier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="cycles of each condition")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--gap-ms", type=float, default=9.0, help="the sleep standing for a collective")
    args = parser.parse_args()
    torch.set_num_threads(1)
    compute, step, params = _cycle(args.hidden, args.tokens, args.layers)
    for _ in range(3):
        compute()
        step()
    order = [CONDITIONS[i % len(CONDITIONS)] for i in range(args.rounds * len(CONDITIONS))]
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    neighbour = ctx.Process(target=_neighbour, args=(args, barrier, order))
    neighbour.start()
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in CONDITIONS}
    gap = args.gap_ms / 1e3
    for condition in order:
        barrier.wait()
        t0 = time.perf_counter_ns()
        compute()
        t1 = time.perf_counter_ns()
        step()
        t2 = time.perf_counter_ns()
        time.sleep(gap)
        barrier.wait()
        times[condition].append(((t1 - t0) / 1e6, (t2 - t1) / 1e6))
    neighbour.join()
    print(
        f"cycle: MLP forward+backward, {args.layers} layers x {args.hidden} hidden, {args.tokens} tokens, 1 thread; "
        f"Adam over {params * 4 / 2**20:.1f} MiB of parameters; then {args.gap_ms:g} ms asleep; "
        f"{args.rounds} cycles a condition, alternating"
    )
    base = [statistics.median(x[k] for x in times["in step"]) for k in (0, 1)]
    print(f"{'neighbour':<16}{'compute ms':>12}{'vs in step':>12}{'optimizer ms':>14}{'vs in step':>12}")
    for condition in CONDITIONS:
        med = [statistics.median(x[k] for x in times[condition]) for k in (0, 1)]
        print(
            f"{condition:<16}{med[0]:>12.2f}{(med[0] / base[0] - 1) * 100:>+11.1f}%"
            f"{med[1]:>14.2f}{(med[1] / base[1] - 1) * 100:>+11.1f}%"
        )


if __name__ == "__main__":
    main()
