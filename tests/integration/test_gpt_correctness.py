"""Parallel GPT runs, fully real on CPU, give the losses of the same model run in one process.

Each layout runs 3 iterations in float64 with every rank a real process on ``BACKEND``; the
reference is tp=pp=dp=1 with ``dp * M`` microbatches, which sees the same global batch. Ranks
run under a hard deadline, so a deadlock fails the test instead of hanging it.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from prism.capture.launch import free_port
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.train import GPTWorkload
from prism.peers import BACKEND_NAME, FreeRunningClock, VirtualWorld, activate

pytestmark = pytest.mark.slow

BACKEND = "gloo"
STEPS = 3
TIMEOUT_S = 90.0
BASE = GPTConfig(
    layers=4,
    hidden=32,
    heads=4,
    seq_len=16,
    vocab=64,
    micro_batch_size=2,
    microbatches=4,
    tp=1,
    pp=1,
    dp=1,
    dtype="float64",
    grad_bucket_mb=0.05,  # several buckets for this small model
)


# -- launch harness --------------------------------------------------------------------------


def _rank_entry(
    fn: Callable, rank: int, world: int, backend: str, port: int, results: mp.Queue, args: tuple
) -> None:
    try:
        torch.set_num_threads(1)
        if backend == BACKEND_NAME:  # every rank real: each prism group delegates to gloo
            activate(VirtualWorld(real_ranks=None, clock=FreeRunningClock()))
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=TIMEOUT_S),
        )
        try:
            results.put((rank, True, fn(*args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_world(fn: Callable, world: int, *args, backend: str = BACKEND, timeout_s: float = TIMEOUT_S) -> list:
    """Run ``fn(*args)`` on every rank of a fresh ``world``-process group; its results by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_entry, args=(fn, r, world, backend, port, results, args), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    out: dict[int, object] = {}
    try:
        while len(out) < world:
            if time.monotonic() > deadline:
                pytest.fail(f"world of {world} timed out after {timeout_s:.0f} s (deadlock?)")
            try:
                rank, ok, payload = results.get(timeout=0.5)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    pytest.fail(f"a rank died without reporting (exit codes {dead})")
                continue
            if not ok:
                pytest.fail(f"rank {rank} failed:\n{payload}")
            out[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]


# -- the runs --------------------------------------------------------------------------------


def train_losses(cfg: GPTConfig) -> list[float | None]:
    """Per-step losses of this rank (None off the last stage)."""
    workload = GPTWorkload(cfg)
    return [workload.train_step(i).loss for i in range(STEPS)]


def global_losses(per_rank: list[list[float | None]]) -> list[float]:
    """Mean over data-parallel replicas (each reported by every TP rank of the last stage)."""
    reporting = [losses for losses in per_rank if losses[0] is not None]
    return [sum(r[i] for r in reporting) / len(reporting) for i in range(STEPS)]


@pytest.fixture(scope="module")
def reference() -> Callable[[int], list[float]]:
    """Single-process losses with ``microbatches`` per iteration (cached)."""
    cache: dict[int, list[float]] = {}

    def get(microbatches: int) -> list[float]:
        if microbatches not in cache:
            cfg = replace(BASE, microbatches=microbatches)
            cache[microbatches] = global_losses(run_world(train_losses, 1, cfg))
        return cache[microbatches]

    return get


@pytest.mark.parametrize(
    ("tp", "pp", "dp"),
    [(2, 2, 1), (1, 1, 2), (1, 4, 1)],
    ids=["tp2-pp2", "dp2", "pp4"],
)
def test_parallel_run_matches_single_process(tp: int, pp: int, dp: int, reference) -> None:
    cfg = replace(BASE, tp=tp, pp=pp, dp=dp)
    per_rank = run_world(train_losses, cfg.layout.world_size, cfg)
    last_stage = [r for r in range(cfg.layout.world_size) if cfg.layout.stage(r) == pp - 1]
    assert [r for r, losses in enumerate(per_rank) if losses[0] is not None] == last_stage
    tp_groups = {cfg.layout.group(r, "tp") for r in last_stage}
    for group in tp_groups:  # every TP rank of the last stage computes the same loss
        assert all(per_rank[r] == pytest.approx(per_rank[group[0]], rel=1e-12) for r in group)
    expected = reference(dp * BASE.microbatches)
    assert global_losses(per_rank) == pytest.approx(expected, rel=1e-9, abs=0)
    # The loss moves: the optimizer really stepped the same way in both runs.
    assert expected[0] != pytest.approx(expected[-1], rel=1e-6)


def test_prism_backend_with_every_rank_real_matches_single_process(reference) -> None:
    """The ground-truth runs of ``prism-capture --real all`` go through the prism backend."""
    cfg = replace(BASE, tp=2, pp=2, dp=1)
    per_rank = run_world(train_losses, cfg.layout.world_size, cfg, backend=BACKEND_NAME)
    assert global_losses(per_rank) == pytest.approx(reference(BASE.microbatches), rel=1e-9, abs=0)


def test_workload_rejects_a_world_of_the_wrong_size() -> None:
    [message] = run_world(_construct_error, 1, replace(BASE, dp=2))
    assert "world size 1" in message


def _construct_error(cfg: GPTConfig) -> str:
    try:
        GPTWorkload(cfg)
    except ValueError as e:
        return str(e)
    return ""
