"""The calibration microbenchmark: real gloo collectives and send/recv among local processes.

Every process joins one gloo world on localhost; each (op, bytes, group size) is timed
``reps`` times after ``warmup`` untimed repetitions, and rank 0 writes the medians.

With ``compute_between_s`` > 0 the calls are *cold*, as a training step makes them: before
each call every member keeps its CPU busy for that long, only the call itself is timed, and the
point's time is the *mean* over members and calls (what a member's program loses per call on
average; heavy tails count, since a step's time is their sum). On a VM a gloo call costs more
the longer its process computed before it (64 KiB all_reduce, 2 processes: 0.6 ms back to
back, 1.1 ms median after 1 ms of compute, 2.3 ms after 5 ms), which back-to-back timing misses.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


class CalibrationError(RuntimeError):
    """The benchmark failed or its timings cannot be fitted."""


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One measured point: the time of one (op, bytes, group size) on one node."""

    op: str
    """Comm-log op name."""
    bytes: int
    """Bytes this rank contributes, as in the comm log."""
    group_size: int
    """Members of the group."""
    seconds: float
    """Median duration (back-to-back calls), or mean over members and calls (cold calls)."""
    source: str = "bench"
    """'bench' (microbenchmark) or 'comm_log' (delegated calls of a capture)."""
    count: int = 1
    """Observations behind the median."""


# -- the microbenchmark ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """What every benchmark process runs (pickled to the spawned processes)."""

    world: int
    port: int
    group_sizes: tuple[int, ...]
    sizes: tuple[int, ...]
    ops: tuple[str, ...]
    reps: int
    calls_per_rep: int
    warmup: int
    timeout_s: float
    result_path: str
    compute_between_s: float = 0.0


def run_benchmark(
    *, max_procs: int, sizes: tuple[int, ...], ops: tuple[str, ...], reps: int, calls_per_rep: int, warmup: int,
    timeout_s: float, compute_between_s: float = 0.0,
) -> list[Sample]:  # fmt: skip
    """Spawn gloo processes on localhost and time every (op, size, group size); rank 0 reports."""
    group_sizes = tuple(2**i for i in range(1, max_procs.bit_length()) if 2**i <= max_procs)
    with tempfile.TemporaryDirectory(prefix="prism-calibrate-") as tmp:
        plan = _Plan(
            world=group_sizes[-1], port=_free_port(), group_sizes=group_sizes, sizes=tuple(sorted(sizes)),
            ops=ops, reps=reps, calls_per_rep=calls_per_rep, warmup=warmup,
            timeout_s=timeout_s, result_path=str(Path(tmp) / "result.json"), compute_between_s=compute_between_s,
        )  # fmt: skip
        ctx = mp.get_context("spawn")  # fork would copy this process's threads and torch state
        procs = [ctx.Process(target=_worker, args=(r, plan), daemon=True) for r in range(plan.world)]
        for proc in procs:
            proc.start()
        _join(procs, timeout_s)
        points = json.loads(Path(plan.result_path).read_text())
    return [Sample(op=op, bytes=n, group_size=p, seconds=t, count=reps) for op, n, p, t in points]


def _free_port() -> int:

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(procs: list, timeout_s: float) -> None:
    """Wait for all; on a failure or timeout kill the rest so a stuck collective never hangs us."""
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.exitcode is None for p in procs):
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise CalibrationError(f"a benchmark process exited with code {failed[0]} (see its stderr)")
            if time.monotonic() > deadline:
                raise CalibrationError(f"benchmark still running after {timeout_s:.0f} s; killed")
            time.sleep(0.05)
        if any(p.exitcode != 0 for p in procs):
            raise CalibrationError("a benchmark process failed (see its stderr)")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()


def _points(plan: _Plan) -> list[tuple[str, int, int]]:
    """(op, group size, float32 elements per rank) in the order every rank runs them."""
    points = []
    for p in plan.group_sizes:
        for op in plan.ops:
            if op == "barrier":
                points.append((op, p, 0))
            elif op != "send" or p == 2:  # the ping-pong runs between ranks 0 and 1 only
                points += [(op, p, max(1, size // 4 // p) * p) for size in plan.sizes]
    return points


def _worker(rank: int, plan: _Plan) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{plan.port}", rank=rank, world_size=plan.world,
        timeout=timedelta(seconds=plan.timeout_s),
    )  # fmt: skip
    groups = {p: dist.new_group(list(range(p))) for p in plan.group_sizes}
    points = _points(plan)
    times = torch.zeros(len(points), plan.reps, dtype=torch.float64)
    for i, (op, p, numel) in enumerate(points):
        if rank < p:
            times[i] = torch.tensor(_time_point(_make_call(op, p, numel, rank, groups[p]), groups[p], plan))
    cold = plan.compute_between_s > 0
    # Back to back, the slowest member sets a collective's time; cold, every member's wait counts,
    # so the members' mean is kept. Ranks outside a group contribute zeros.
    dist.all_reduce(times, op=dist.ReduceOp.SUM if cold else dist.ReduceOp.MAX)
    if rank == 0:
        if cold:
            members = torch.tensor([float(p) for _, p, _ in points], dtype=torch.float64)
            seconds = (times.mean(dim=1) / members).tolist()
        else:
            seconds = times.median(dim=1).values.tolist()
        rows = [
            (op, 4 * numel, p, t / 2 if op == "send" else t)
            for (op, p, numel), t in zip(points, seconds, strict=True)
        ]
        Path(plan.result_path).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _time_point(call, group, plan: _Plan) -> list[float]:
    import torch.distributed as dist

    out = []
    for rep in range(plan.warmup + plan.reps):
        dist.barrier(group=group)
        if plan.compute_between_s > 0:
            spent = 0.0
            for _ in range(plan.calls_per_rep):
                _busy(plan.compute_between_s)
                start = time.perf_counter()
                call()
                spent += time.perf_counter() - start
        else:
            start = time.perf_counter()
            for _ in range(plan.calls_per_rep):
                call()
            spent = time.perf_counter() - start
        if rep >= plan.warmup:
            out.append(spent / plan.calls_per_rep)
    return out


def _busy(seconds: float) -> None:
    """Keep this CPU busy (not asleep) for ``seconds``, as a step's compute between two calls does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _make_call(op: str, p: int, numel: int, rank: int, group):
    """A no-argument callable running ``op`` once with ``numel`` float32 elements per rank."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(numel)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        out = torch.zeros({"all_gather": numel * p, "reduce_scatter": numel // p}.get(op, numel))
        fn = {"all_gather": dist.all_gather_single, "reduce_scatter": dist.reduce_scatter_single}
        return lambda: fn.get(op, dist.all_to_all_single)(out, x, group=group)
    if op in ("gather", "scatter"):
        chunks = [torch.zeros(numel) for _ in range(p)] if rank == 0 else None
        if op == "gather":
            return lambda: dist.gather(x, chunks, dst=0, group=group)
        return lambda: dist.scatter(x, chunks, src=0, group=group)
    if op == "send":
        return lambda: _ping_pong(x, rank)
    return {
        "all_reduce": lambda: dist.all_reduce(x, group=group),
        "broadcast": lambda: dist.broadcast(x, src=0, group=group),
        "reduce": lambda: dist.reduce(x, dst=0, group=group),
        "barrier": lambda: dist.barrier(group=group),
    }[op]


def _ping_pong(x, rank: int) -> None:
    """One round trip between ranks 0 and 1; the worker halves its time (one-way send)."""
    import torch.distributed as dist

    if rank == 0:
        dist.send(x, 1)
        dist.recv(x, 1)
    else:
        dist.recv(x, 0)
        dist.send(x, 0)
