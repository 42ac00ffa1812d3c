"""Where a torch.distributed.pipelining program's real run spends its transfers, rank by rank.

    .venv/bin/python benchmarks/pipeline_p2p.py [--nproc 2] [--warmup 10] [--json out.json] -- \\
        examples/pp.py --pp 2 --schedule ZBVZeroBubble --steps 40

Runs the program under plain torchrun (every rank real, gloo, one intra-op thread each, as the
fidelity benchmark's real run) and times, inside each rank, every batch of sends and receives the
pipeline schedule posts (``torch.distributed.pipelining.schedules._batch_p2p``) and every wait on
them (``_wait_batch_p2p``), each iteration cut at the optimizer step. Per rank, over the
iterations after the warm-up: the iteration, the time inside posts and inside waits (medians and
p90 of the per-iteration sums), the longest single post, and the share of iterations whose posts
took more than ``--slow-post-ms``.

A graph prices a transfer by the comm model and lets the program go on at once after posting
it; a post that blocks in the real run is time neither the simulation nor a replay's virtual
peers have. The two hooks are private functions of torch's pipelining schedules (torch 2.5-2.9).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

PROBE_ENV = "PRISM_P2P_PROBE_OUT"


def probe(argv: list[str]) -> None:
    """In a rank process under torchrun: run the program with its schedule's posts and waits timed."""
    from torch.distributed.pipelining import schedules
    from torch.optim.optimizer import register_optimizer_step_post_hook

    iterations: list[int] = []
    posts: list[tuple[int, int]] = []  # (iteration, ns)
    waits: list[tuple[int, int]] = []
    began = [time.perf_counter_ns()]
    post, wait = schedules._batch_p2p, schedules._wait_batch_p2p

    def timed_post(ops, desc=None):
        t0 = time.perf_counter_ns()
        works = post(ops, desc)
        posts.append((len(iterations), time.perf_counter_ns() - t0))
        return works

    def timed_wait(works) -> None:
        t0 = time.perf_counter_ns()
        wait(works)
        waits.append((len(iterations), time.perf_counter_ns() - t0))

    def step_ended(optimizer, args, kwargs) -> None:
        now = time.perf_counter_ns()
        iterations.append(now - began[0])
        began[0] = now

    schedules._batch_p2p, schedules._wait_batch_p2p = timed_post, timed_wait
    register_optimizer_step_post_hook(step_ended)
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)  # as ``python train.py`` would have it
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        out = Path(os.environ[PROBE_ENV]) / f"rank{os.environ['RANK']}.json"
        out.write_text(json.dumps({"iterations": iterations, "posts": posts, "waits": waits}))


def _per_iteration(events: list[list[int]], count: int) -> list[float]:
    sums = [0] * count
    for it, ns in events:
        if it < count:
            sums[it] += ns
    return [s / 1e6 for s in sums]


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def summarize(rank_file: Path, warmup: int, slow_post_ms: float) -> dict:
    data = json.loads(rank_file.read_text())
    count = len(data["iterations"])
    if count <= warmup:
        raise SystemExit(f"{rank_file}: {count} iteration(s), not more than the {warmup} of warm-up")
    keep = slice(warmup, count)
    iters = [ns / 1e6 for ns in data["iterations"]][keep]
    posts, waits = _per_iteration(data["posts"], count)[keep], _per_iteration(data["waits"], count)[keep]
    longest = max((ns / 1e6 for it, ns in data["posts"] if warmup <= it < count), default=0.0)
    return {
        "iterations": len(iters),
        "iter_ms": statistics.median(iters), "iter_p90_ms": _p90(iters),
        "post_ms": statistics.median(posts), "post_p90_ms": _p90(posts), "longest_post_ms": longest,
        "wait_ms": statistics.median(waits), "wait_p90_ms": _p90(waits),
        "slow_post_share": sum(p > slow_post_ms for p in posts) / len(posts),
    }  # fmt: skip


def main() -> None:
    if os.environ.get(PROBE_ENV):
        probe(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10, help="iterations left out of the figures")
    parser.add_argument("--slow-post-ms", type=float, default=5.0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- train.py ARGS")
    args = parser.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("give the program after --, e.g. -- examples/pp.py --pp 2")
    with tempfile.TemporaryDirectory(prefix="prism-p2p-") as out:
        env = os.environ | {PROBE_ENV: out, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc),
                   __file__, *program]  # fmt: skip
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the program did not end within {args.timeout_s:.0f} s") from None
        if done.returncode != 0:
            raise SystemExit(f"the program failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        ranks = {
            r: summarize(Path(out) / f"rank{r}.json", args.warmup, args.slow_post_ms)
            for r in range(args.nproc)
        }
    table = Table(
        title=f"{' '.join(program)}: the pipeline schedule's transfers in the real run (ms per iteration)"
    )
    for column in ("rank", "iterations", "iteration (p90)", "in posts (p90)", "longest post", "in waits (p90)",
                   f"iterations with posts > {args.slow_post_ms:g} ms"):  # fmt: skip
        table.add_column(column, justify="right")
    for rank, s in ranks.items():
        table.add_row(
            str(rank), str(s["iterations"]), f"{s['iter_ms']:.1f} ({s['iter_p90_ms']:.1f})",
            f"{s['post_ms']:.2f} ({s['post_p90_ms']:.2f})", f"{s['longest_post_ms']:.2f}",
            f"{s['wait_ms']:.2f} ({s['wait_p90_ms']:.2f})", f"{s['slow_post_share']:.0%}",
        )  # fmt: skip
    Console(width=160).print(table)
    if args.json:
        args.json.write_text(json.dumps({"program": program, "nproc": args.nproc, "ranks": ranks}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
