"""A GPU rank's timeline simulated from its trace (prism.graph.traces.gpu_timeline) against the trace
itself: public traces recorded on real GPUs (tests/data/gpu_traces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prism.graph.traces.gpu import GPU_KINDS, read_gpu_trace
from prism.graph.traces.gpu_timeline import LaunchModel, simulate_timeline, step_times

TRACES = Path(__file__).resolve().parents[1] / "data" / "gpu_traces"


@pytest.mark.parametrize("name", ["event_sync.json.gz", "nccl_ddp_rank0.json.gz"])
def test_each_profiled_step_and_its_gpu_work_are_reproduced_within_one_percent(name: str) -> None:
    trace = read_gpu_trace(TRACES / name)
    steps = step_times(trace, simulate_timeline(trace))
    assert len(steps) == len(trace.steps) >= 1
    assert (steps["err_pct"].abs() < 1.0).all(), steps
    assert (steps["gpu_err_pct"].abs() < 1.0).all(), steps


def test_a_wrong_launch_model_shows_in_the_steps() -> None:
    # The check above is not true by construction: with launches 0.2 ms slower and a busy
    # stream's events 50 us apart, the same trace's GPU work and its synchronized step run long.
    trace = read_gpu_trace(TRACES / "event_sync.json.gz")
    steps = step_times(trace, simulate_timeline(trace, LaunchModel(launch_ns=200_000, stream_ns=50_000)))
    assert (steps["gpu_err_pct"] > 5).all() and (steps["err_pct"] > 5).all(), steps


def test_the_fitted_delays_are_the_traces_own() -> None:
    trace = read_gpu_trace(TRACES / "nccl_ddp_rank0.json.gz")
    model = simulate_timeline(trace).model
    # An A100 DDP run: launches reach an idle stream in ~10 us, busy streams chain in ~1 us.
    assert 5_000 < model.launch_ns < 30_000 and 0 < model.stream_ns < 5_000


def test_work_waits_for_the_stream_it_waits_on_and_syncs_hold_the_cpu() -> None:
    trace = read_gpu_trace(TRACES / "event_sync_multi_stream.json.gz")
    timeline = simulate_timeline(trace)
    ev = trace.events
    on_gpu = ev["kind"].isin([k.value for k in GPU_KINDS]).to_numpy()
    shift = (timeline.start_ns - ev["start_ns"].to_numpy())[on_gpu]
    assert np.abs(shift).max() < 20_000  # every GPU event within 20 us of where it ran
    sync = ev.index[ev["name"] == "cudaDeviceSynchronize"][0]
    assert timeline.end_ns[sync] >= timeline.end_ns[on_gpu].max()  # the device sync outlasts all GPU work
