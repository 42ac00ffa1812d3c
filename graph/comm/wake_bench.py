"""How much longer a rank's compute takes right after it waited for a peer, by how long it waited.

A pipeline stage blocks in a receive until its neighbour sends, then computes. On a shared CPU
host (a VM's vCPUs above all) that compute runs slower than the same compute back to back
(likely its vCPU descheduled, its caches taken by the neighbour). A slice capture's rank mostly
waits only for the modelled transfer, since its virtual neighbours are never late, so the graph's
compute is the warm one, and a simulated stage that waits for its neighbours is short by this
much after every such wait (``prism.graph.sim.engine`` adds it; the spec's
``wake_compute`` table holds it).

Two gloo processes on localhost. Rank 0 measures; rank 1 is the neighbour and computes small
matmuls whenever it is not answering. Each round goes through the conditions in turn, so that
the machine's slow spells fall on all of them:

- back to back: rank 0 computes a unit, then times ``UNITS_TIMED`` units;
- after a wait of about ``g`` ms: rank 0 computes a unit, orders its neighbour to compute ``g``
  ms more and then answer (a tiny gloo send), blocks in the receive of the answer, and
  times ``UNITS_TIMED`` units as soon as it returns.

A condition's extra time is the median of its timed units over the median back to back; its wait
is the median time rank 0 was blocked (the answer's transfer included).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from prism.graph.comm.bench import BUSY_CHUNK, CalibrationError, _compute_until, _join

UNITS_TIMED = 4
"""Units timed after each wait (about 1 ms each): the slowdown is mostly in the first one and gone
by the fourth (after a 16 ms wait on a 2-vCPU VM: +590, +100, +130, +40 µs, then noise)."""
UNIT_TOKENS, UNIT_HIDDEN = 128, 128
"""The unit: one MLP block's forward and backward (hidden → 4·hidden → hidden) over these tokens,
about 1 ms on one thread of a 2-vCPU VM, the size of a small model's layer."""


@dataclass(frozen=True, kw_only=True)
class WakeSample:
    """One condition: how long rank 0 waited and what its next units cost over back to back."""

    wait_s: float
    """Median time blocked in the receive (0 for back to back)."""
    units_s: float
    """Median time of the ``UNITS_TIMED`` units after it."""
    extra_s: float
    """``units_s`` less the back-to-back median (may be negative: noise, or a wait that helps)."""
    rounds: int


@dataclass(frozen=True)
class _Plan:
    port: int
    gaps_s: tuple[float, ...]
    rounds: int
    warmup: int
    timeout_s: float
    result_path: str


def run_wake_benchmark(
    *, gaps_ms: tuple[float, ...], rounds: int, warmup: int = 3, timeout_s: float = 300.0
) -> list[WakeSample]:
    """Time compute after waits of each of ``gaps_ms`` against back to back (module docstring):
    one sample per gap, in increasing order of wait."""
    from torch.distributed.elastic.utils.distributed import get_free_port

    if not gaps_ms or any(not g > 0 for g in gaps_ms) or rounds < 1 or warmup < 0:
        raise ValueError("wake benchmark: positive gaps (ms), rounds ≥ 1, warmup ≥ 0")
    with tempfile.TemporaryDirectory(prefix="prism-wake-") as tmp:
        plan = _Plan(
            port=get_free_port(), gaps_s=tuple(sorted(g / 1e3 for g in gaps_ms)), rounds=rounds, warmup=warmup,
            timeout_s=timeout_s, result_path=str(Path(tmp) / "rows.json"),
        )  # fmt: skip
        ctx = mp.get_context("spawn")  # fork would copy this process's threads and torch state
        order = ctx.Array("d", [0.0, 0.0])  # (orders given, seconds the last one asks for; < 0: stop)
        procs = [ctx.Process(target=_worker, args=(r, plan, order), daemon=True) for r in range(2)]
        for proc in procs:
            proc.start()
        _join(procs, timeout_s)
        rows = json.loads(Path(plan.result_path).read_text())
    return summarise_wake(rows, rounds)


def summarise_wake(rows: list[list], rounds: int) -> list[WakeSample]:
    """``rows``: (condition, blocked ns, timed units ns); condition -1 is back to back, ``k`` the
    ``k``-th gap. One sample per gap, sorted by wait."""
    by_condition: dict[int, list[tuple[int, int]]] = {}
    for condition, blocked_ns, units_ns in rows:
        by_condition.setdefault(condition, []).append((blocked_ns, units_ns))
    if -1 not in by_condition or len(by_condition) < 2:
        raise CalibrationError("wake benchmark: no back-to-back or no waited rows to compare")
    base = statistics.median(u for _, u in by_condition.pop(-1)) / 1e9
    samples = []
    for values in by_condition.values():
        units = statistics.median(u for _, u in values) / 1e9
        wait = statistics.median(b for b, _ in values) / 1e9
        samples.append(WakeSample(wait_s=wait, units_s=units, extra_s=units - base, rounds=rounds))
    return sorted(samples, key=lambda s: s.wait_s)


def wake_table(samples: list[WakeSample]) -> dict[str, float]:
    """The spec's ``wake_compute`` table: wait (µs, as text) -> extra seconds."""
    return {str(max(1, round(s.wait_s * 1e6))): s.extra_s for s in samples}


def mlp_forward(tokens: int = UNIT_TOKENS, hidden: int = UNIT_HIDDEN):
    """The unit's forward: one MLP block (hidden → 4·hidden → hidden) over ``tokens``, returning a
    scalar to call ``backward`` on (one thread's worth of a small model's layer)."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(tokens, hidden)
    w1 = torch.randn(hidden, 4 * hidden, requires_grad=True)
    w2 = torch.randn(4 * hidden, hidden, requires_grad=True)
    return lambda: (torch.nn.functional.gelu(x @ w1) @ w2).sum()


def _unit():
    forward = mlp_forward()
    return lambda: forward().backward()


def _worker(rank: int, plan: _Plan, order) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one compute thread per member, as the jobs' ranks run
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{plan.port}", rank=rank, world_size=2,
        timeout=timedelta(seconds=plan.timeout_s),
    )  # fmt: skip
    run = _unit()
    chunk = torch.randn(BUSY_CHUNK, BUSY_CHUNK)  # the neighbour's compute, in small steps to end on time
    for _ in range(20):
        run()
    answer = torch.zeros(1)
    dist.barrier()
    if rank == 1:
        _neighbour(order, answer, chunk)
    else:
        rows = _measure(run, plan, order, answer)
        give_order(order, -1.0)
        Path(plan.result_path).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def give_order(order, seconds: float) -> None:
    """Tell the neighbour to compute ``seconds`` more and then answer (-1: stop). ``order`` is a
    shared ``Array('d', [number, seconds])``: a gloo receive cannot be polled for orders."""
    with order.get_lock():
        order[1] = seconds
        order[0] += 1


def next_order(order, seen: float, busy) -> tuple[float, float]:
    """Run ``busy()`` until an order after number ``seen`` comes: (its number, its seconds)."""
    while order[0] == seen:
        busy()
    with order.get_lock():
        return order[0], order[1]


def _neighbour(order, answer, chunk) -> None:
    """Compute without pause; on each order (shared memory: a gloo receive cannot be polled), compute
    that long more, answer through gloo, and go on computing."""
    import torch
    import torch.distributed as dist

    seen = 0.0
    while True:
        seen, seconds = next_order(order, seen, lambda: torch.mm(chunk, chunk))
        if seconds < 0:
            return
        _compute_until(time.monotonic_ns() + int(seconds * 1e9), chunk)
        dist.send(answer, dst=0)


def _measure(run, plan: _Plan, order, answer) -> list[tuple[int, int, int]]:
    """Rank 0's rounds: (condition, blocked ns, timed units ns) of each condition of each round."""
    import torch.distributed as dist

    rows = []
    for rnd in range(plan.warmup + plan.rounds):
        for condition in (-1, *range(len(plan.gaps_s))):
            run()  # warm before the wait, as a stage is when it comes to wait
            blocked = 0
            if condition >= 0:
                t = time.perf_counter_ns()
                give_order(order, plan.gaps_s[condition])
                dist.recv(answer, src=1)
                blocked = time.perf_counter_ns() - t
            t = time.perf_counter_ns()
            for _ in range(UNITS_TIMED):
                run()
            if rnd >= plan.warmup:
                rows.append((condition, blocked, time.perf_counter_ns() - t))
    return rows
