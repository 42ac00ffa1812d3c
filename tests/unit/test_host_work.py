"""The host-side work of a replayed rank's virtual collectives: how much, and for how long."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from prism.graph.comm.bench import Sample
from prism.graph.comm.calibrate import HOST_FIT_MIN_BYTES, host_work_table
from prism.peers.host_work import MIN_WORK_NS, HostWork, host_work_of
from prism.schemas.cluster import ClusterSpec, ClusterSpecError, preset


def _wait_idle(work: HostWork, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while work._tasks and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)  # the last task, taken off the queue, finishes


def test_a_call_costs_its_bytes_times_its_class_rate_and_small_ones_nothing() -> None:
    work = HostWork({"all_reduce": 0.5, "all_gather": 1.0})
    assert work.work_ns("all_reduce", 10**6) == 500_000
    assert work.work_ns("all_gather", 10**6) == 1_000_000
    assert work.work_ns("broadcast", 10**6) == 0  # a class the spec did not measure
    assert work.start("all_reduce", 2 * MIN_WORK_NS - 2, None) == 0  # under MIN_WORK_NS: not worth a wake
    assert work.start("all_reduce", 40 * 10**6, None) == 20_000_000
    assert work.asked_ns == 20_000_000
    _wait_idle(work)
    # CPU time of the work's own thread: all of it, give or take one chunk.
    assert work.done_ns == pytest.approx(20e6, rel=0.1)


def test_the_work_stops_at_the_calls_modelled_end() -> None:
    work = HostWork({"all_reduce": 0.5})
    asked = work.start("all_reduce", 10**9, time.time_ns() + 5_000_000)  # 500 ms asked, 5 ms allowed
    assert asked == 500_000_000
    _wait_idle(work)
    assert 0 < work.done_ns < 100_000_000


def test_it_tells_when_a_calls_work_has_stopped_and_never_for_work_it_skips() -> None:
    work = HostWork({"all_reduce": 0.5})
    done = threading.Event()
    assert work.start("all_reduce", 20 * 10**6, None, then=done.set) == 10_000_000
    assert done.wait(timeout=10) and work.done_ns >= 9_000_000  # called after the work, not before
    skipped = threading.Event()
    assert work.start("all_reduce", 16, None, then=skipped.set) == 0
    _wait_idle(work)
    assert not skipped.is_set()  # the caller completes a skipped call itself


def test_the_spec_names_it_per_class_and_a_graph_without_it_asks_none() -> None:
    spec = ClusterSpec.from_dict(preset("h100-ib").to_dict() | {"host_ns_per_byte": {"all_reduce": 0.4}})
    assert ClusterSpec.from_toml(spec.to_toml()).host_ns_per_byte == {"all_reduce": 0.4}
    assert HostWork.of_table(spec.host_ns_per_byte).ns_per_byte == {"all_reduce": 0.4}
    assert HostWork.of_table(preset("h100-ib").host_ns_per_byte) is None
    with pytest.raises(ClusterSpecError, match="host_ns_per_byte.all_reduce must be non-negative"):
        ClusterSpec.from_dict(preset("h100-ib").to_dict() | {"host_ns_per_byte": {"all_reduce": -1}})


def test_calibration_fits_cpu_per_byte_through_the_origin_on_large_calls() -> None:
    big = HOST_FIT_MIN_BYTES

    def sample(op: str, nbytes: int, cpu_s: float | None, source: str = "bench") -> Sample:
        return Sample(op=op, bytes=nbytes, group_size=2, seconds=1.0, source=source, cpu_seconds=cpu_s)

    samples = [
        sample("all_reduce", big, big * 0.4e-9),
        sample("all_reduce", 4 * big, 4 * big * 0.4e-9),
        sample("all_reduce", 4096, 1e-3),  # a small call's fixed cost: left out
        sample("all_gather", 2 * big, 2 * big * 1.2e-9),
        sample("send", 4 * big, 1.0),  # a ping-pong: left out
        sample("all_reduce", 8 * big, 1.0, source="comm_log"),  # no CPU measured
        sample("broadcast", 8 * big, None),
    ]
    table = host_work_table(samples)
    assert set(table) == {"all_reduce", "all_gather"}
    assert table["all_reduce"] == pytest.approx(0.4) and table["all_gather"] == pytest.approx(1.2)


def test_a_rank_job_asks_for_it_on_cpu_only() -> None:
    import dataclasses

    from prism.capture.workloads.gpt.config import GPTConfig
    from prism.schemas.manifest import RankJob

    job = RankJob(workload="gpt", config=GPTConfig().to_dict(), real_ranks=(), warmup=3, iterations=1, threads=1,
                  host_ns_per_byte={"all_reduce": 0.4})  # fmt: skip
    assert RankJob.from_dict(job.to_dict()) == job
    assert (
        RankJob.from_dict(job.to_dict() | {"host_ns_per_byte": None}).host_ns_per_byte == {}
    )  # older job files
    assert host_work_of(job).ns_per_byte == {"all_reduce": 0.4}
    assert host_work_of(dataclasses.replace(job, host_ns_per_byte={})) is None
    assert (
        host_work_of(dataclasses.replace(job, config=GPTConfig(device="cuda").to_dict())) is None
    )  # NCCL: on the device


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a core for each thread")
def test_the_work_goes_on_while_the_programs_thread_holds_the_interpreter() -> None:
    # gloo's threads never take the interpreter lock: the work must not wait for the program.
    work = HostWork({"all_reduce": 1.0})
    done = threading.Event()
    work.start("all_reduce", 60 * 10**6, None, then=done.set)  # 60 ms of work
    time.sleep(0.01)  # the work's thread takes the task and enters the work
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)  # pure Python below keeps the lock until it sleeps
    try:
        spin_until = time.perf_counter() + 0.2
        while time.perf_counter() < spin_until:
            pass
    finally:
        sys.setswitchinterval(interval)
    spun = time.perf_counter()
    assert done.wait(timeout=10)
    # The work ran beside the spin; a loop that needed the lock between chunks would be about
    # one chunk in, its 60 ms still ahead.
    assert time.perf_counter() - spun < 0.03
    assert work.done_ns >= 55_000_000
