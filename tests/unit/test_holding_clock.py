"""A capture's holding clock: each virtual call holds the program, asleep, for its price."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from prism.capture.workloads.gpt.config import GPTConfig
from prism.peers import virtual_work
from prism.peers.backend import BACKEND_NAME, VirtualWorld, activate, current_comm_log
from prism.peers.clock import FreeRunningClock, HoldingClock, PendingCall, capture_clock
from prism.peers.comm_model import CommModel
from prism.schemas.cluster import ClusterSpec
from prism.schemas.manifest import RankJob

# A slow machine: 20 ms a hop, so that a hold is long beside the backend's own few µs.
SPEC = ClusterSpec(
    name="slow",
    gpus_per_node=4,
    intra_bandwidth_bytes_per_s=1e9,
    intra_latency_s=0.02,
    inter_bandwidth_bytes_per_s=1e8,
    inter_latency_s=0.05,
)


def _call(op: str, nbytes: int, group_size: int) -> PendingCall:
    return PendingCall(op=op, group="g", label="tp0", group_size=group_size, gseq=0, bytes=nbytes)


def test_a_call_is_held_for_its_price_under_the_spec() -> None:
    clock, model = HoldingClock(SPEC), CommModel(SPEC)
    assert clock.hold_ns(_call("all_reduce", 4096, 2)) == model.duration_ns("all_reduce", 4096, 2, 1)
    # Eight members on nodes of four span two: the price crosses the network.
    assert clock.hold_ns(_call("all_gather", 1024, 8)) == model.duration_ns("all_gather", 1024, 8, 2)
    # A transfer is priced within a node, whatever group it is made on.
    assert clock.hold_ns(_call("recv", 65536, 16)) == model.duration_ns("recv", 65536, 2, 1)
    assert clock.hold_ns(_call("all_reduce", 4096, 1)) == 0
    before = time.time_ns()
    due = clock.completion_ns(_call("all_reduce", 4096, 2))
    assert due is not None and due - before >= model.duration_ns("all_reduce", 4096, 2, 1)
    assert clock.completion_ns(_call("all_reduce", 4096, 1)) is None  # nothing to wait for


def test_a_capture_holds_only_cpu_ranks_whose_job_names_a_spec() -> None:
    def job(device: str, spec: ClusterSpec | None) -> RankJob:
        config = GPTConfig(tp=2, device=device)
        return RankJob(
            workload="gpt",
            config=config.to_dict(),
            real_ranks=(),
            warmup=1,
            iterations=1,
            threads=1,
            hold_calls=spec,
        )

    assert isinstance(capture_clock(job("cpu", SPEC)), HoldingClock)
    assert isinstance(capture_clock(job("cpu", None)), FreeRunningClock)
    # On CUDA the host does not wait in a call.
    assert isinstance(capture_clock(job("cuda", SPEC)), FreeRunningClock)


def test_a_rank_job_keeps_its_spec_through_json() -> None:
    job = RankJob(
        workload="gpt",
        config=GPTConfig(tp=2).to_dict(),
        real_ranks=(),
        warmup=1,
        iterations=1,
        threads=1,
        hold_calls=SPEC,
    )
    assert RankJob.from_dict(job.to_dict()).hold_calls == SPEC
    free = RankJob(
        workload="gpt", config=GPTConfig(tp=2).to_dict(), real_ranks=(), warmup=1, iterations=1, threads=1
    )
    assert RankJob.from_dict(free.to_dict()).hold_calls is None


@pytest.fixture
def held_world() -> Iterator[None]:
    activate(VirtualWorld(real_ranks=frozenset({0}), clock=HoldingClock(SPEC), labeler=lambda ranks: None))
    dist.init_process_group(BACKEND_NAME, rank=0, world_size=2, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_the_program_sleeps_through_a_held_call(held_world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hold is a wait, as a real call's is: the program's thread sleeps to its end, where a
    replay's clock would spin through the last stretch (and keep the core warm)."""
    slept: list[float] = []
    asleep_at: list[int] = []
    sleep = time.sleep

    def recorded(seconds: float) -> None:
        asleep_at.append(time.perf_counter_ns())
        slept.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(virtual_work.time, "sleep", recorded)
    price = CommModel(SPEC).duration_ns("all_reduce", 4096, 2, 1)
    began = time.perf_counter_ns()
    dist.all_reduce(torch.ones(1024))
    assert time.perf_counter_ns() - began >= price
    # All that was left when the thread went to sleep is slept (a busy machine may start it late).
    left = price - (asleep_at[0] - began)
    assert sum(slept) * 1e9 > left - virtual_work._SPIN_NS / 2
    call = current_comm_log().calls[-1]
    assert call.done_ns - call.enter_ns >= price
