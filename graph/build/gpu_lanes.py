"""A GPU rank's trace as lanes of the simulation engine: its CPU threads and GPU streams.

``prism.graph.traces.gpu_timeline`` defines what a GPU rank's timeline is, from its trace's
dependencies and a launch model; ``simulate_lanes`` computes the same timeline with the engine
that simulates graphs (``prism.graph.sim.engine``), each lane one engine lane and each
dependency one of its cross-lane dependencies:

- a CUDA runtime call is two nodes on its thread's lane: its start (no duration, the recorded
  CPU gap before it) and its body (its recorded duration; for a synchronizing call, what it
  took to return after the work it waited for, which it depends on);
- a kernel, memcpy or memset is one node on its stream's lane, the stream delay after the one
  before it, depending on its launch call's start with the launch delay as the dependency's
  lag and on the work its stream waits for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prism.graph.sim.engine import COMPUTE, Engine
from prism.graph.sim.simulate import SimGraph
from prism.graph.traces.gpu import GpuTrace, dependencies
from prism.graph.traces.gpu_timeline import LaunchModel, Timeline, edges_into, on_lanes, trace_lanes
from prism.schemas.layout import ParallelLayout


@dataclass(frozen=True)
class LaneGraph:
    """The engine's graph of one GPU rank's trace, and where each event's nodes are."""

    graph: SimGraph
    """One engine lane ("rank") per CPU thread and per GPU stream."""
    start_clock: np.ndarray
    """Each lane's start: its first event's recorded start."""
    first_node: np.ndarray
    """Each event's first node (-1: not on a lane: a CPU op)."""
    last_node: np.ndarray
    """Each event's last node."""


def lane_graph(trace: GpuTrace, edges, model: LaunchModel) -> LaneGraph:
    """The trace's CPU threads and GPU streams with ``edges`` (``dependencies(trace)``)."""
    ev = trace.events
    rec_start, rec_end = ev["start_ns"].to_numpy(), ev["end_ns"].to_numpy()
    on_gpu, on_cpu = on_lanes(ev)
    launch_of, waits, syncs = edges_into(edges)
    lanes = trace_lanes(ev, on_gpu, on_cpu)
    first_node = np.full(len(ev), -1, np.int64)
    last_node = np.full(len(ev), -1, np.int64)
    rank_ptr, n = [0], 0
    for rows in lanes:  # node ids first: dependencies point across lanes, forwards and back
        for e in rows:
            first_node[e] = n
            n += 2 if on_cpu[e] else 1
            last_node[e] = n - 1
        rank_ptr.append(n)
    dur, gap = np.zeros(n, np.int64), np.zeros(n, np.int64)
    deps: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (node, lag)
    for rows in lanes:
        previous = -1
        for e in rows:
            a, b = first_node[e], last_node[e]
            if on_cpu[e]:
                if previous >= 0:
                    gap[a] = rec_start[e] - rec_end[previous]
                if e in syncs:  # returns what it took after the later of its start and the work
                    waited = max(rec_end[s] for s in syncs[e])
                    dur[b] = rec_end[e] - max(rec_start[e], waited)
                    deps[b] = [(last_node[s], 0) for s in syncs[e]]
                else:
                    dur[b] = rec_end[e] - rec_start[e]
            else:
                if previous >= 0:
                    gap[a] = model.stream_ns
                dur[a] = rec_end[e] - rec_start[e]
                if e in launch_of:
                    deps[a].append((first_node[launch_of[e]], model.launch_ns))
                deps[a] += [(last_node[w], 0) for w in waits.get(e, ())]
            previous = e
    counts = np.array([len(d) for d in deps], np.int64)
    flat = [pair for d in deps for pair in d]
    graph = SimGraph(
        layout=ParallelLayout(tp=1, pp=1, dp=1), static_bytes=np.zeros(1, np.int64),
        rank_ptr=np.array(rank_ptr, np.int64), stage=np.zeros(n, np.int16), kind=np.full(n, COMPUTE, np.int8),
        dur=dur, gap=gap, is_async=np.zeros(n, np.bool_), slot=np.full(n, -1, np.int32),
        slot_size=np.zeros(0, np.int64), slot_nodes_ptr=np.zeros(1, np.int64), slot_nodes=np.zeros(0, np.int64),
        deps_ptr=np.r_[0, np.cumsum(counts)].astype(np.int64),
        deps=np.array([d for d, _ in flat], np.int64), deps_lag=np.array([lag for _, lag in flat], np.int64),
        alloc=np.zeros(n, np.int64), free=np.zeros(n, np.int64),
    )  # fmt: skip
    start_clock = np.array([rec_start[rows[0]] for rows in lanes], np.int64)
    return LaneGraph(graph=graph, start_clock=start_clock, first_node=first_node, last_node=last_node)


def simulate_lanes(trace: GpuTrace, model: LaunchModel | None = None) -> Timeline:
    """The rank's timeline (``prism.graph.traces.gpu_timeline.simulate_timeline``'s), computed by
    the engine on the trace's lanes."""
    edges = dependencies(trace)
    model = model or LaunchModel.fit(trace, edges)
    lanes = lane_graph(trace, edges, model)
    g = lanes.graph
    engine = Engine(g, lanes.start_clock)
    engine.advance()
    stuck = np.flatnonzero(engine.pc < g.rank_ptr[1:])
    if len(stuck):
        raise ValueError(f"{trace.path}: the dependencies have a cycle ({len(stuck)} lane(s) cannot finish)")
    on_lane = lanes.first_node >= 0
    start = np.full(len(trace.events), -1, np.int64)
    end = np.full(len(trace.events), -1, np.int64)
    start[on_lane] = engine.start[lanes.first_node[on_lane]]
    end[on_lane] = engine.end[lanes.last_node[on_lane]]
    return Timeline(start_ns=start, end_ns=end, model=model, edges=edges)
