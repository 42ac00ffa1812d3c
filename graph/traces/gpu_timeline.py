"""One GPU rank's timeline, simulated from its trace's dependencies and a launch model.

The lanes are the rank's CPU threads and GPU streams. A CPU thread runs its CUDA runtime calls
in order, the CPU work between two calls kept as recorded (the gap); a GPU stream runs its
kernels, memcpys and memsets in order, each for its recorded duration. What the trace's
dependencies (``prism.graph.traces.gpu.dependencies``) then decide:

- a GPU event starts at the latest of its launch call's start plus the **launch delay**, the
  previous event of its stream's end plus the **stream delay**, and the end of the work its
  stream waits for (``cudaStreamWaitEvent``);
- a synchronizing call (stream, event or device sync) ends at the latest of its start and the
  end of the GPU work it waits for, plus the time it took to return after that (as recorded:
  CPU time, like the gaps);
- everything after a call on its thread moves with it.

The two delays are one number each for the rank (``LaunchModel.fit``: the medians of the trace's
own launch-bound and stream-bound events), not each event's recorded delay, so that a
simulation of the trace as it is tests the model: ``step_times`` compares each
``ProfilerStep`` of the trace with the same step on the simulated timeline.
"""

from __future__ import annotations

import heapq
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.graph.traces.gpu import GPU_KINDS, EdgeKind, EventKind, GpuTrace, dependencies

_GPU = [k.value for k in GPU_KINDS]


@dataclass(frozen=True)
class LaunchModel:
    """The rank's delays, ns."""

    launch_ns: int
    """From a launch call's start to its work's start, where the stream was idle."""
    stream_ns: int
    """From one event's end to the next's start on a busy stream."""

    @classmethod
    def fit(cls, trace: GpuTrace, edges: pd.DataFrame) -> LaunchModel:
        ev = trace.events
        start, end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
        launch = edges[edges["kind"] == EdgeKind.LAUNCH.value]
        launched_at = dict(zip(launch["dst"], start[launch["src"]], strict=True))
        stream = edges[edges["kind"] == EdgeKind.STREAM.value]
        previous_end = dict(zip(stream["dst"], end[stream["src"]], strict=True))
        launch_bound, stream_bound = [], []
        for i, t in launched_at.items():
            prev = previous_end.get(i)
            if prev is None or prev < t:  # the stream was idle when the work was launched
                launch_bound.append(start[i] - t)
            else:
                stream_bound.append(start[i] - prev)
        return cls(launch_ns=_median(launch_bound), stream_ns=_median(stream_bound))


def _median(values: list[int]) -> int:
    return int(statistics.median(values)) if values else 0


@dataclass(frozen=True)
class Timeline:
    """Simulated start and end (ns, on the trace's clock) of every event on a lane (-1: not on one),
    under ``model`` and the trace's dependency ``edges``."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    model: LaunchModel
    edges: pd.DataFrame


def simulate_timeline(trace: GpuTrace, model: LaunchModel | None = None) -> Timeline:
    """The rank's timeline under ``model`` (default: fitted to the trace)."""
    ev = trace.events
    edges = dependencies(trace)
    model = model or LaunchModel.fit(trace, edges)
    rec_start, rec_end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    on_gpu, on_cpu = on_lanes(ev)
    lane_prev = _lane_predecessors(ev, on_gpu, on_cpu)
    launch_of, waits, syncs = edges_into(edges)
    waited = {d: max(rec_end[s] for s in srcs) for d, srcs in syncs.items()}
    preds: dict[int, set[int]] = {n: {p} if p >= 0 else set() for n, p in lane_prev.items()}
    for dst, src in launch_of.items():
        preds[dst].add(src)
    for table in (waits, syncs):
        for dst, srcs in table.items():
            preds[dst].update(srcs)
    after: dict[int, list[int]] = defaultdict(list)
    for n, ps in preds.items():
        for p in ps:
            after[p].append(n)
    needs = {n: len(ps) for n, ps in preds.items()}

    start = np.full(len(ev), -1, np.int64)
    end = np.full(len(ev), -1, np.int64)
    # Kahn's order, the earliest recorded start first: deterministic, and as recorded where free.
    ready = [(rec_start[n], n) for n, k in needs.items() if k == 0]
    heapq.heapify(ready)
    while ready:
        _, n = heapq.heappop(ready)
        prev = lane_prev[n]
        if on_gpu[n]:
            t = rec_start[n] if prev < 0 else end[prev] + model.stream_ns
            launch = launch_of.get(n)
            if launch is not None:
                t = max(t, start[launch] + model.launch_ns)
            for w in waits.get(n, ()):
                t = max(t, end[w])
            start[n], end[n] = t, t + (rec_end[n] - rec_start[n])
        else:
            t = rec_start[n] if prev < 0 else end[prev] + (rec_start[n] - rec_end[prev])
            start[n] = t
            if n in syncs:  # from its start or the work's end, what it took after either
                after_wait = rec_end[n] - max(rec_start[n], waited[n])
                end[n] = max(t, max(end[s] for s in syncs[n])) + after_wait
            else:
                end[n] = t + (rec_end[n] - rec_start[n])
        for m in after.get(n, ()):
            needs[m] -= 1
            if needs[m] == 0:
                heapq.heappush(ready, (rec_start[m], m))
    if (start[list(needs)] < 0).any():
        raise ValueError(f"{trace.path}: the dependencies have a cycle")
    return Timeline(start_ns=start, end_ns=end, model=model, edges=edges)


def on_lanes(ev: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Which events run on a GPU stream, and which are runtime calls on a CPU thread."""
    kind = ev["kind"].to_numpy()
    return np.isin(kind, _GPU), kind == EventKind.RUNTIME.value


def edges_into(edges: pd.DataFrame) -> tuple[dict[int, int], dict[int, list[int]], dict[int, list[int]]]:
    """By the event they lead to: its launch call, the work its stream waits for, and (a
    synchronizing call) the GPU work it waits for."""
    launch_of: dict[int, int] = {}
    waits: dict[int, list[int]] = defaultdict(list)
    syncs: dict[int, list[int]] = defaultdict(list)
    for src, dst, k in zip(edges["src"], edges["dst"], edges["kind"], strict=True):
        if k == EdgeKind.LAUNCH.value:
            launch_of[dst] = src
        elif k == EdgeKind.STREAM_WAIT.value:
            waits[dst].append(src)
        elif k == EdgeKind.SYNC.value:
            syncs[dst].append(src)
    return launch_of, waits, syncs


def _lane_predecessors(ev: pd.DataFrame, on_gpu: np.ndarray, on_cpu: np.ndarray) -> dict[int, int]:
    """Each lane event's predecessor on its lane (-1: the first): CPU threads and GPU streams."""
    prev: dict[int, int] = {}
    for rows in trace_lanes(ev, on_gpu, on_cpu):
        rows = rows.tolist()
        prev.update(zip(rows, [-1, *rows[:-1]], strict=True))
    return prev


def trace_lanes(ev: pd.DataFrame, on_gpu: np.ndarray, on_cpu: np.ndarray) -> list[np.ndarray]:
    """The rows of each lane in start order: the CPU threads' runtime calls, then each
    (device, stream)'s GPU work."""
    lanes = pd.concat([
        ev[on_cpu].assign(lane_a=-1, lane_b=ev.loc[on_cpu, "tid"]),
        ev[on_gpu].assign(lane_a=ev.loc[on_gpu, "device"], lane_b=ev.loc[on_gpu, "stream"]),
    ])  # fmt: skip
    ordered = lanes.sort_values("start_ns", kind="stable").groupby(["lane_a", "lane_b"], sort=False)
    return [lane.index.to_numpy() for _, lane in ordered]


def step_times(trace: GpuTrace, timeline: Timeline) -> pd.DataFrame:
    """Each ProfilerStep as recorded and on the simulated timeline, ms: the step itself (on the
    thread that marked it) and its GPU work (from the step's start to the end of the last GPU
    event launched inside it, which a step that does not wait for the GPU can outlast)."""
    ev = trace.events
    on_gpu, _ = on_lanes(ev)
    launch = timeline.edges.query("kind == 'launch'")
    launched_at = pd.Series(ev["start_ns"].to_numpy()[launch["src"]], index=launch["dst"].to_numpy())
    rows = []
    for step in trace.steps.itertuples():
        lane = ev[(ev["kind"] == EventKind.RUNTIME.value) & (ev["tid"] == step.tid)]
        begin, finish = (_simulated_at(lane, timeline, t) for t in (step.start_ns, step.end_ns))
        inside = launched_at[(launched_at >= step.start_ns) & (launched_at < step.end_ns)].index
        inside = inside[on_gpu[inside]]
        gpu_rec = ev["end_ns"].to_numpy()[inside].max() - step.start_ns if len(inside) else 0
        gpu_sim = timeline.end_ns[inside].max() - begin if len(inside) else 0
        rows.append(
            (
                step.step,
                (step.end_ns - step.start_ns) / 1e6,
                (finish - begin) / 1e6,
                gpu_rec / 1e6,
                gpu_sim / 1e6,
            )
        )
    out = pd.DataFrame(
        rows, columns=["step", "recorded_ms", "simulated_ms", "gpu_recorded_ms", "gpu_simulated_ms"]
    )
    out["err_pct"] = 100 * (out["simulated_ms"] / out["recorded_ms"] - 1)
    out["gpu_err_pct"] = 100 * (out["gpu_simulated_ms"] / out["gpu_recorded_ms"] - 1)
    return out


def _simulated_at(lane: pd.DataFrame, timeline: Timeline, t: int) -> int:
    """Where recorded time ``t`` of a thread falls on the simulated timeline: moved as the last
    call of the thread that began by then (CPU work after a call moves with it)."""
    began = lane[lane["start_ns"] <= t]
    if began.empty:
        return t
    n = began.index[-1]
    rec_start, rec_end = began.at[n, "start_ns"], began.at[n, "end_ns"]
    if t <= rec_end:
        return int(timeline.start_ns[n] + (t - rec_start))
    return int(timeline.end_ns[n] + (t - rec_end))
