"""The calibration microbenchmark: real gloo collectives and send/recv among local processes.

Every process joins one gloo world on localhost; each (op, bytes, group size) is timed over
``reps`` repetitions of ``calls_per_rep`` calls, after ``warmup`` untimed repetitions (the
repetitions go round the points, so that the machine's slow spells fall on all of them), and
rank 0 writes one time per point: the *mean latency after the last member arrived* (each
member's exit minus the latest entry, on the machine's monotonic clock), over members and
calls. A mean, because a step's time is the sum of its calls' and heavy tails count: on a
2-vCPU VM a small all-reduce is bimodal (0.6 ms or 2+ ms), and a median of back-to-back
repetitions flipped between the modes from one calibration to the next (64 KiB: 1.24 ms,
128 KiB: 0.60 ms in one run; 1.55 and 1.51 ms in the run before). From the last arrival,
because the members' arrival skew is the benchmark's loop, not the job's; the graph models
the job's own (``prism.graph.sim.noise``), and a replay lets the real rank arrive when it does.

With ``compute_between_s`` > 0 the calls are *cold*, as a training step makes them: before
each call every member keeps its CPU busy for that long. On a VM a gloo call costs more the
longer its process computed before it, which back-to-back timing misses.

A send is timed as a pipeline makes it: the sender computes, then sends to a receiver whose recv
is already posted and who waits for it, and the receiver's exit counts from the later entry, as
a collective's exits do: the price of a transfer a stage waits for. A ping-pong's half round trip, timed
before, is not that price: 550-970 µs mean on a 2-vCPU VM where these transfers took 120-180 µs.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEND_AFTER_COMPUTE_S = 1e-3
"""How long a transfer's sender computes before each send when calls are otherwise timed back to
back: a stage sends what it has just computed, and on a 2-vCPU VM transfers timed back to back
took 3-4x as long as after their sender computed (the mean of both ends' waits: 340-470 µs
against 90-150 µs, 512 B to 192 KiB)."""


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
    """Mean latency after the last member arrived (a send: after the later of its two posts);
    a comm-log sample: the median of its calls' durations."""
    source: str = "bench"
    """'bench' (microbenchmark) or 'comm_log' (delegated calls of a capture)."""
    count: int = 1
    """Observations behind the time (repetitions of the point)."""
    cpu_seconds: float | None = None
    """CPU time rank 0's process (all its threads) spent per call, over the timed calls; None
    where not measured (comm-log samples)."""


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
    from torch.distributed.elastic.utils.distributed import get_free_port  # torch only when calibrating

    group_sizes = tuple(2**i for i in range(1, max_procs.bit_length()) if 2**i <= max_procs)
    with tempfile.TemporaryDirectory(prefix="prism-calibrate-") as tmp:
        plan = _Plan(
            world=group_sizes[-1], port=get_free_port(), group_sizes=group_sizes, sizes=tuple(sorted(sizes)),
            ops=ops, reps=reps, calls_per_rep=calls_per_rep, warmup=warmup,
            timeout_s=timeout_s, result_path=str(Path(tmp) / "result.json"), compute_between_s=compute_between_s,
        )  # fmt: skip
        ctx = mp.get_context("spawn")  # fork would copy this process's threads and torch state
        procs = [ctx.Process(target=_worker, args=(r, plan), daemon=True) for r in range(plan.world)]
        for proc in procs:
            proc.start()
        _join(procs, timeout_s)
        points = json.loads(Path(plan.result_path).read_text())
    return [
        Sample(op=op, bytes=n, group_size=p, seconds=t, count=reps, cpu_seconds=cpu)
        for op, n, p, t, cpu in points
    ]


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
            elif op != "send" or p == 2:  # a transfer runs between ranks 0 and 1 only
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
    # Every call's entry and exit (monotonic ns, one clock for all local processes), so that the
    # latency after the last arrival can be told apart from the members' skew.
    times = torch.zeros(len(points), plan.reps * plan.calls_per_rep, 2, dtype=torch.int64)
    mine = {
        i: (_make_call(op, p, numel, rank, groups[p], point=i, plan=plan), groups[p])
        for i, (op, p, numel) in enumerate(points)
        if rank < p
    }
    timed, cpu_ns = _time_points(mine, plan)
    for i, stamps in timed.items():
        times[i] = torch.tensor(stamps)
    gathered = [torch.zeros_like(times) for _ in range(plan.world)]
    dist.all_gather(gathered, times)
    seconds = [
        _mean_latency_s([g[i] for g in gathered[:p]], waiters=RECEIVER if op == "send" else None)
        for i, (op, p, _) in enumerate(points)
    ]
    if rank == 0:
        calls = plan.reps * plan.calls_per_rep
        rows = [
            (op, 4 * numel, p, t, cpu_ns[i] / calls / 1e9)
            for i, ((op, p, numel), t) in enumerate(zip(points, seconds, strict=True))
        ]
        Path(plan.result_path).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _time_points(
    calls: dict[int, tuple[Callable[[], None], object]], plan: _Plan
) -> tuple[dict[int, list], dict[int, int]]:
    """``[entry_ns, exit_ns]`` of every timed call of each point, each after ``compute_between_s``
    of compute (a transfer's ends as ``_transfer`` says), and the CPU time this process
    (every thread: gloo copies and reduces on its own) spent in each point's timed calls, the
    compute between them left out. Repetitions go round the points (every point's first, then
    every point's second, ...), so that a slow spell of the machine, which lasts seconds on a
    VM, falls on every point alike instead of on the few timed in it: back to back, point after
    point, one calibration's 64 KiB all-reduce read 1.19 ms and the next one's, seconds later,
    1.92 ms."""
    import torch.distributed as dist

    out: dict[int, list] = {i: [] for i in calls}
    cpu_ns = dict.fromkeys(calls, 0)
    for rep in range(plan.warmup + plan.reps):
        for i, (call, group) in calls.items():
            dist.barrier(group=group)
            stamps, cpu = [], 0
            for _ in range(plan.calls_per_rep):
                gap_s = getattr(call, "compute_before_s", plan.compute_between_s)
                if gap_s > 0:
                    _busy(gap_s)
                cpu_entry, entry = time.process_time_ns(), time.monotonic_ns()
                call()
                stamps.append([entry, time.monotonic_ns()])
                cpu += time.process_time_ns() - cpu_entry
            if rep >= plan.warmup:
                out[i] += stamps
                cpu_ns[i] += cpu
    return out, cpu_ns


RECEIVER = (1,)
"""The member of a transfer whose exit times it (``_transfer``: rank 1 receives)."""


def _mean_latency_s(members: list, waiters: tuple[int, ...] | None = None) -> float:
    """Mean over calls, and over the members that wait for the call (``waiters``, indices into
    ``members``; None: all), of the latency after the last arrival. A transfer is its receiver's
    wait: its sender may return before the receiver even comes to wait (the recv was posted
    beforehand and the data is in), so the sender's exit can precede the last arrival.

    ``members``: per member, an int64 tensor of ``[entry_ns, exit_ns]`` per call."""
    import torch

    stamps = torch.stack(members).double()  # member, call, (entry, exit)
    last_arrival = stamps[..., 0].max(dim=0).values
    exits = stamps[..., 1] if waiters is None else stamps[list(waiters), :, 1]
    return float((exits - last_arrival).mean()) / 1e9


def _busy(seconds: float) -> None:
    """Keep this CPU busy (not asleep) for ``seconds``, as a step's compute between two calls does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _make_call(op: str, p: int, numel: int, rank: int, group, *, point: int, plan: _Plan):
    """A no-argument callable running ``op`` once with ``numel`` float32 elements per rank, as
    prism's runtime makes it: the Work is waited on through ``CallerReleasesWork``, whose wait
    lasts until gloo's worker thread has let go of the tensors, a cost every delegated call of a
    capture or a fully real run pays."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(numel)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        out = torch.zeros({"all_gather": numel * p, "reduce_scatter": numel // p}.get(op, numel))
        fn = {"all_gather": dist.all_gather_single, "reduce_scatter": dist.reduce_scatter_single}
        return _released(
            [out, x], lambda: fn.get(op, dist.all_to_all_single)(out, x, group=group, async_op=True)
        )
    if op in ("gather", "scatter"):
        chunks = [torch.zeros(numel) for _ in range(p)] if rank == 0 else []
        if op == "gather":
            return _released(
                [x, *chunks], lambda: dist.gather(x, chunks or None, dst=0, group=group, async_op=True)
            )
        return _released(
            [x, *chunks], lambda: dist.scatter(x, chunks or None, src=0, group=group, async_op=True)
        )
    if op == "send":
        return _transfer(
            x, rank, tag=point, calls=(plan.warmup + plan.reps) * plan.calls_per_rep,
            sender_compute_s=plan.compute_between_s or SEND_AFTER_COMPUTE_S,
        )  # fmt: skip
    issue = {
        "all_reduce": lambda: dist.all_reduce(x, group=group, async_op=True),
        "broadcast": lambda: dist.broadcast(x, src=0, group=group, async_op=True),
        "reduce": lambda: dist.reduce(x, dst=0, group=group, async_op=True),
        "barrier": lambda: dist.barrier(group=group, async_op=True),
    }[op]
    return _released([] if op == "barrier" else [x], issue)


def _released(payload: list, issue):
    # The runtime's own wrapper: calibration times the path the jobs take (graph -> replay is
    # the one import of the runtime here, made in the benchmark's processes only).
    from prism.peers.delegate import CallerReleasesWork

    def call() -> None:
        work = CallerReleasesWork.issue(payload, issue, lambda: None)
        if work is not None:
            work.wait()

    return call


def _transfer(x, rank: int, *, tag: int, calls: int, sender_compute_s: float):
    """A callable making one of ``calls`` transfers from rank 0 to rank 1 as a pipeline makes
    them: rank 1's recv is posted before rank 0 sends (the next as soon as the last is in, as a
    stage posts its next receive) and rank 1 waits while rank 0 computes ``sender_compute_s``
    and sends, so that a call runs from rank 0's post to the data in rank 1's hands; each end
    waits on its own Work. ``tag`` keeps each point's receives to its own sends while every
    point has one posted."""
    import torch.distributed as dist

    from prism.peers.delegate import CallerReleasesWork

    if rank == 0:
        send = _released([x], lambda: dist.isend(x, 1, tag=tag))
        send.compute_before_s = sender_compute_s
        return send

    def post():
        return CallerReleasesWork.issue([x], lambda: dist.irecv(x, 0, tag=tag), lambda: None)

    left = itertools.count(calls - 1, -1)
    pending = [post()]

    def recv() -> None:
        pending.pop().wait()
        if next(left) > 0:
            pending.append(post())

    recv.compute_before_s = 0.0  # computing through the transfer would hide its time
    return recv


# -- collectives beside compute ----------------------------------------------------------------

BUSY_CHUNK = 48
"""Side of the square matmuls a busy member computes, polling its call between them (10-20 µs
each on a 2-vCPU VM: the resolution of a busy call's end)."""


@dataclass(frozen=True, kw_only=True)
class BusySample:
    """A 2-member all-reduce of one size, its members idle through it and computing through it."""

    bytes: int
    idle_s: float
    """Mean latency after the later issue, the call waited on at once."""
    busy_s: float
    """The same with both members computing from their issue until the call completes."""
    compute_rate: float
    """The members' matmul rate while the call is in flight over their rate with no call in
    flight (1.0: the call takes nothing from the compute)."""
    rounds: int

    @property
    def factor(self) -> float:
        return self.busy_s / self.idle_s


@dataclass(frozen=True, kw_only=True)
class _BusyPlan:
    port: int
    sizes: tuple[int, ...]
    rounds: int
    warmup: int
    span_s: float
    timeout_s: float
    result_path: str


def run_busy_benchmark(
    *, sizes: tuple[int, ...], rounds: int, warmup: int = 3, span_s: float = 0.02, timeout_s: float = 300.0
) -> list[BusySample]:
    """Time a 2-process gloo all-reduce of each size in three ways, round after round (a slow
    spell of the machine falls on all of them): idle (issued and waited on at once, as the
    calibration's points are), busy (each member computes matmuls after issuing it, polling it
    between them, for at least ``span_s`` and until it has completed) and no call (the same
    compute alone for ``span_s``, for the rate)."""
    from torch.distributed.elastic.utils.distributed import get_free_port

    if any(n < 4 for n in sizes) or rounds < 1 or warmup < 0 or not span_s > 0:
        raise ValueError("busy benchmark: sizes of 4 bytes or more, rounds ≥ 1, warmup ≥ 0, a positive span")
    with tempfile.TemporaryDirectory(prefix="prism-busy-") as tmp:
        plan = _BusyPlan(
            port=get_free_port(), sizes=tuple(sorted(sizes)), rounds=rounds, warmup=warmup, span_s=span_s,
            timeout_s=timeout_s, result_path=str(Path(tmp) / "rows.json"),
        )  # fmt: skip
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_busy_worker, args=(r, plan), daemon=True) for r in range(2)]
        for proc in procs:
            proc.start()
        _join(procs, timeout_s)
        members = json.loads(Path(plan.result_path).read_text())
    return summarise_busy(members, rounds)


def _compute_until(deadline_ns: int, a, work=None) -> tuple[int, int, int]:
    """Matmuls until ``deadline_ns`` and, with ``work``, until it has completed; returns (matmuls,
    when ``work`` was first seen complete (0: never polled), matmuls done before that)."""
    import torch

    done_ns, n, n_during = 0, 0, 0
    while time.monotonic_ns() < deadline_ns or (work is not None and not done_ns):
        torch.mm(a, a)
        n += 1
        if work is not None and not done_ns and work.is_completed():
            done_ns, n_during = time.monotonic_ns(), n
    return n, done_ns, n_during


def _busy_worker(rank: int, plan: _BusyPlan) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one compute thread per member, as the jobs' ranks run
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{plan.port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=plan.timeout_s),
    )  # fmt: skip
    a = torch.randn(BUSY_CHUNK, BUSY_CHUNK)
    span_ns = int(plan.span_s * 1e9)
    tensors = {n: torch.zeros(max(1, n // 4)) for n in plan.sizes}
    rows = []  # (bytes, way, issue_ns, done_ns, matmuls in flight, ns in flight)
    for rnd in range(plan.warmup + plan.rounds):
        for n in plan.sizes:
            for way in ("idle", "busy", "no call"):
                dist.barrier()
                issue = time.monotonic_ns()
                if way == "no call":
                    count, _, _ = _compute_until(issue + span_ns, a)
                    row = (n, way, issue, issue + span_ns, count, span_ns)
                else:
                    work = dist.all_reduce(tensors[n], async_op=True)
                    if way == "idle":
                        work.wait()
                        row = (n, way, issue, time.monotonic_ns(), 0, 0)
                    else:
                        _, done, during = _compute_until(issue + span_ns, a, work)
                        work.wait()
                        row = (n, way, issue, done, during, done - issue)
                if rnd >= plan.warmup:
                    rows.append(row)
    everyone = [None, None]
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        Path(plan.result_path).write_text(json.dumps(everyone))
    dist.barrier()
    dist.destroy_process_group()


def summarise_busy(members: list[list], rounds: int) -> list[BusySample]:
    """Per size: each way's latency after the later issue (mean over members, then over rounds)
    and the compute rate in flight. ``members``: each member's rows, in the same order."""
    by_size: dict[int, dict[str, list[float]]] = {}
    for rows in zip(*members, strict=True):
        n, way = rows[0][0], rows[0][1]
        stats = by_size.setdefault(n, {"idle": [], "busy": [], "rate": [], "alone": []})
        if way == "no call":
            stats["alone"] += [r[4] / r[5] for r in rows]
            continue
        last_issue = max(r[2] for r in rows)
        stats[way].append(statistics.fmean(r[3] - last_issue for r in rows) / 1e9)
        if way == "busy":
            stats["rate"] += [r[4] / r[5] for r in rows if r[5] > 0]
    return [
        BusySample(
            bytes=n,
            idle_s=statistics.fmean(s["idle"]),
            busy_s=statistics.fmean(s["busy"]),
            compute_rate=statistics.fmean(s["rate"]) / statistics.fmean(s["alone"]) if s["rate"] else 1.0,
            rounds=rounds,
        )  # fmt: skip
        for n, s in sorted(by_size.items())
    ]
