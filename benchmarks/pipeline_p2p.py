"""Where a torch.distributed.pipelining program's real run spends its transfers, rank by rank.

    .venv/bin/python benchmarks/pipeline_p2p.py [--nproc 2] [--warmup 10] [--json out.json] -- \\
        examples/pp.py --pp 2 --schedule ZBVZeroBubble --steps 40

Runs the program under plain torchrun (every rank real, gloo, one intra-op thread each, as the
fidelity benchmark's real run) and times, inside each rank, every batch of sends and receives the
pipeline schedule posts (``torch.distributed.pipelining.schedules._batch_p2p``) and every wait on
them (``_wait_batch_p2p``), each iteration cut at the optimizer step. Per rank, over the
iterations after the warm-up: the iteration, the time inside posts and inside waits (medians and
p90 of the per-iteration sums), the longest single post, and the share of iterations whose posts
took more than ``--slow-post-ms``. Where a post's time goes: per post its wall time, the CPU
time of the rank's thread in it and whether the thread was preempted in it (an involuntary
context switch), and per gloo ``send`` / ``recv`` call inside it (``ProcessGroup.send`` /
``recv``, entry to return) its wall and CPU time: medians over the posts after the warm-up.

A graph prices a transfer by the comm model and lets the program go on at once after posting
it; a post that blocks in the real run is time neither the simulation nor a replay's virtual
peers have. The two hooks are private functions of torch's pipelining schedules (torch 2.5-2.13).

With ``--graph GRAPH`` (a graph of the same program at the same layout, ``prism-build-graph``),
each rank's iteration is also cut at its waits: the program's own time before each wait (since
the previous one returned), each wait, and the time after the last, real (medians over the
iterations after the warm-up) beside the graph's simulation, where a wait is the time from
reaching a ``prism:wait`` node to its end. The places add up to the iteration on both sides, so
the table says where a simulated iteration's error sits: in a rank's own work between two waits,
or in a wait (the other rank's work and the transfer). Waits with no post between them (one
batch's works) count as one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
    import torch.distributed as dist
    from torch.distributed.pipelining import schedules

    from prism.capture.optimizer_steps import register_outer_step_hooks

    spans: list[tuple[str, int, int]] = []  # ("post" | "wait", began, ended): perf_counter_ns
    bounds: list[int] = [time.perf_counter_ns()]  # where each iteration ended (the first: the start)
    costs: list[tuple[int, int, int]] = []  # per post: (began, its thread's CPU ns, preempted 0/1)
    calls: list[tuple[str, int, int, int]] = []  # per gloo call: (send | recv, began, wall ns, CPU ns)
    post, wait = schedules._batch_p2p, schedules._wait_batch_p2p

    def timed_post(ops, desc=None):
        switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        cpu, t0 = time.thread_time_ns(), time.perf_counter_ns()
        works = post(ops, desc)
        if ops:  # the schedules post and wait on empty batches too: nothing happens there
            spans.append(("post", t0, time.perf_counter_ns()))
            preempted = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw > switches
            costs.append((t0, time.thread_time_ns() - cpu, int(preempted)))
        return works

    def timed_call(name: str, call):
        def timed(self, *args, **kwargs):
            cpu, t0 = time.thread_time_ns(), time.perf_counter_ns()
            work = call(self, *args, **kwargs)
            calls.append((name, t0, time.perf_counter_ns() - t0, time.thread_time_ns() - cpu))
            return work

        return timed

    for name in ("send", "recv"):
        setattr(dist.ProcessGroup, name, timed_call(name, getattr(dist.ProcessGroup, name)))

    def timed_wait(works) -> None:
        t0 = time.perf_counter_ns()
        wait(works)
        if works:
            spans.append(("wait", t0, time.perf_counter_ns()))

    def step_ended(optimizer, args, kwargs) -> None:
        bounds.append(time.perf_counter_ns())

    schedules._batch_p2p, schedules._wait_batch_p2p = timed_post, timed_wait
    register_outer_step_hooks(post=step_ended)
    sys.argv = list(argv)
    sys.path[0] = str(Path(argv[0]).resolve().parent)  # as ``python train.py`` would have it
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        out = Path(os.environ[PROBE_ENV]) / f"rank{os.environ['RANK']}.json"
        out.write_text(json.dumps({"spans": spans, "bounds": bounds, "costs": costs, "calls": calls}))


Span = tuple[str, int, int]  # ("post" | "wait", began, ended), ns


def cut_at_waits(spans: list[Span], start: int, end: int) -> tuple[list[int], list[int]]:
    """One iteration cut at its waits: the program's own time before each wait (since the wait
    before it returned, or the iteration began) and after the last, and each wait's time (ns).
    Waits with no post between them (one batch's works) are one wait."""
    before, waits = [], []
    at, merge = start, False
    for kind, began, ended in sorted(spans, key=lambda s: s[1]):
        if kind == "post":
            merge = False
            continue
        if merge:
            waits[-1] += ended - at
        else:
            before.append(began - at)
            waits.append(ended - began)
        at, merge = ended, True
    return [*before, end - at], waits


def iterations_of(data: dict) -> list[tuple[int, int, list[Span]]]:
    """Every iteration of a rank's probe file: its start, its end, and the posts and waits that
    began in it."""
    bounds, spans = data["bounds"], [tuple(s) for s in data["spans"]]
    return [
        (start, end, [s for s in spans if start <= s[1] < end])
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def real_cuts(data: dict, warmup: int) -> list[tuple[list[int], list[int]]]:
    """``cut_at_waits`` of every iteration after the warm-up of a rank's probe file."""
    return [cut_at_waits(spans, start, end) for start, end, spans in iterations_of(data)[warmup:]]


def simulated_cut(graph: Path, rank: int) -> tuple[list[int], list[int]]:
    """``cut_at_waits`` of the rank's steady pass in the graph's simulation: a wait is the time from
    when the program reached a ``prism:wait`` node to its end; a transfer's call marks a post."""
    from prism.graph.export.trace import rank_trace

    events = sorted(
        (e for e in rank_trace(graph, rank)["traceEvents"] if e["ph"] == "X" and e["tid"] == 1),
        key=lambda e: e["ts"],
    )
    start = reached = round(events[0]["ts"] * 1e3)
    spans: list[Span] = []
    for e in events:
        began, ended = round(e["ts"] * 1e3), round((e["ts"] + e["dur"]) * 1e3)
        if e["cat"] == "user_annotation":  # the call; its span is the transfer, not the program's
            spans.append(("post", began, began))
            continue
        if e["name"] == "prism:wait":
            spans.append(("wait", reached, ended))
        reached = max(reached, ended)
    return cut_at_waits(spans, start, reached)


def segment_rows(
    real: list[tuple[list[int], list[int]]], simulated: tuple[list[int], list[int]]
) -> list[dict]:
    """Per place in the iteration (the program's own time before wait k, wait k, ...), the real
    median and the simulated time in ms; raises when the two cut the iteration differently."""
    shapes = {(len(b), len(w)) for b, w in real}
    if len(shapes) != 1:
        raise SystemExit(f"the real iterations wait a different number of times: {sorted(shapes)}")
    if shapes != {(len(simulated[0]), len(simulated[1]))}:
        raise SystemExit(
            f"the real run waits {len(real[0][1])} times an iteration, the simulation "
            f"{len(simulated[1])} times: not the same program or layout"
        )
    rows = []
    for k, sim_ns in enumerate(simulated[0]):
        rows.append({"place": f"own time before wait {k}" if k < len(simulated[1]) else "own time after the last wait",
                     "real_ms": statistics.median(b[k] for b, _ in real) / 1e6, "sim_ms": sim_ns / 1e6})  # fmt: skip
        if k < len(simulated[1]):
            rows.append({"place": f"wait {k}", "real_ms": statistics.median(w[k] for _, w in real) / 1e6,
                         "sim_ms": simulated[1][k] / 1e6})  # fmt: skip
    return rows


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def summarize(rank_file: Path, warmup: int, slow_post_ms: float) -> dict:
    data = json.loads(rank_file.read_text())
    iterations = iterations_of(data)
    if len(iterations) <= warmup:
        raise SystemExit(
            f"{rank_file}: {len(iterations)} iteration(s), not more than the {warmup} of warm-up"
        )
    kept = iterations[warmup:]

    def ms(spans: list[Span], kind: str) -> list[float]:
        return [(ended - began) / 1e6 for k, began, ended in spans if k == kind]

    since = kept[0][0]
    costs = [c for c in data.get("costs", []) if c[0] >= since]
    one_posts = [p for *_, spans in kept for p in ms(spans, "post")]
    calls = [c for c in data.get("calls", []) if c[1] >= since]

    def med_us(values: list[float]) -> float | None:
        return statistics.median(values) / 1e3 if values else None

    where = {
        "one_post_us": statistics.median(one_posts) * 1e3 if one_posts else None,
        "post_cpu_us": med_us([c[1] for c in costs]),
        "preempted_share": sum(c[2] for c in costs) / len(costs) if costs else None,
        **{f"gloo_{name}_{what}_us": med_us([c[i] for c in calls if c[0] == name])
           for name in ("send", "recv") for what, i in (("wall", 2), ("cpu", 3))},
    }  # fmt: skip
    iters = [(end - start) / 1e6 for start, end, _ in kept]
    posts, waits = ([sum(ms(spans, kind)) for *_, spans in kept] for kind in ("post", "wait"))
    longest = max(one_posts, default=0.0)
    return {
        "iterations": len(iters),
        "iter_ms": statistics.median(iters), "iter_p90_ms": _p90(iters),
        "post_ms": statistics.median(posts), "post_p90_ms": _p90(posts), "longest_post_ms": longest,
        "wait_ms": statistics.median(waits), "wait_p90_ms": _p90(waits),
        "slow_post_share": sum(p > slow_post_ms for p in posts) / len(posts),
        **where,
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
    parser.add_argument(
        "--graph", type=Path, help="a graph of the same program and layout: each rank's iteration cut at its "
        "waits, real (medians) beside simulated"
    )  # fmt: skip
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- train.py ARGS")
    args = parser.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("give the program after --, e.g. -- examples/pp.py --pp 2")
    with tempfile.TemporaryDirectory(prefix="prism-p2p-") as out:
        env = os.environ | {PROBE_ENV: out, "OMP_NUM_THREADS": "1"}
        from prism.fidelity.torchrun import torchrun_command  # not in the ranks this file also runs as

        command = torchrun_command(args.nproc, Path(out) / "torchrun", __file__, *program)
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
        if args.graph is not None:
            for r, summary in ranks.items():
                cuts = real_cuts(json.loads((Path(out) / f"rank{r}.json").read_text()), args.warmup)
                summary["segments"] = segment_rows(cuts, simulated_cut(args.graph, r))
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
    console = Console(width=160)
    console.print(table)
    where = Table(title="where a post's time goes (µs, medians over the posts after the warm-up)")
    for column in ("rank", "post", "its CPU", "preempted in it", "gloo send (CPU)", "gloo recv (CPU)"):
        where.add_column(column, justify="right")

    def us(value: float | None, cpu: float | None = None) -> str:
        if value is None:
            return "-"
        return f"{value:.0f}" if cpu is None else f"{value:.0f} ({cpu:.0f})"

    for rank, s in ranks.items():
        where.add_row(
            str(rank), us(s["one_post_us"]), us(s["post_cpu_us"]), "-" if s["preempted_share"] is None else f"{s['preempted_share']:.0%}",
            us(s["gloo_send_wall_us"], s["gloo_send_cpu_us"]), us(s["gloo_recv_wall_us"], s["gloo_recv_cpu_us"]),
        )  # fmt: skip
    console.print(where)
    for rank, s in ranks.items():
        if "segments" not in s:
            continue
        cut = Table(
            title=f"rank {rank}: the iteration cut at its waits, real (median) vs simulated ({args.graph}), ms"
        )
        for column in ("place", "real", "simulated", "simulated - real"):
            cut.add_column(column, justify="right")
        for row in s["segments"]:
            cut.add_row(row["place"], f"{row['real_ms']:.2f}", f"{row['sim_ms']:.2f}",
                        f"{row['sim_ms'] - row['real_ms']:+.2f}")  # fmt: skip
        real_sum, sim_sum = (sum(row[k] for row in s["segments"]) for k in ("real_ms", "sim_ms"))
        cut.add_row("sum", f"{real_sum:.2f}", f"{sim_sum:.2f}", f"{sim_sum - real_sum:+.2f}")
        console.print(cut)
    if args.json:
        args.json.write_text(json.dumps({"program": program, "nproc": args.nproc, "ranks": ranks}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
