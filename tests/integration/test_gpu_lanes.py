"""A GPU rank's timeline on the simulation engine (``prism.graph.build.gpu_lanes``): CPU threads
and GPU streams as lanes, the trace's launch, stream-wait and sync edges as cross-lane
dependencies. On every public GPU trace kept in tests/data it is the timeline model's
(``prism.graph.traces.gpu_timeline.simulate_timeline``) to the nanosecond."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import prism.graph.build.gpu_lanes as gpu_lanes
from prism.graph.build.gpu_lanes import lane_graph, simulate_lanes
from prism.graph.traces.gpu import EdgeKind, EventKind, dependencies, read_gpu_trace
from prism.graph.traces.gpu_timeline import LaunchModel, simulate_timeline

TRACES = sorted((Path(__file__).parents[1] / "data" / "gpu_traces").glob("*.json.gz"))


@pytest.mark.parametrize("path", TRACES, ids=[p.name.split(".")[0] for p in TRACES])
def test_the_engine_gives_the_models_timeline(path: Path) -> None:
    trace = read_gpu_trace(path)
    model = simulate_timeline(trace)
    engine = simulate_lanes(trace)
    assert engine.model == model.model
    on_lane = model.start_ns >= 0
    assert on_lane.sum() > 0
    np.testing.assert_array_equal(engine.start_ns, model.start_ns)
    np.testing.assert_array_equal(engine.end_ns, model.end_ns)


def test_a_runtime_call_is_two_nodes_and_gpu_work_one() -> None:
    trace = read_gpu_trace(TRACES[[p.name for p in TRACES].index("event_sync.json.gz")])
    edges = dependencies(trace)
    lanes = lane_graph(trace, edges, LaunchModel.fit(trace, edges))
    kind = trace.events["kind"].to_numpy()
    width = lanes.last_node - lanes.first_node + 1
    assert (width[kind == EventKind.RUNTIME.value] == 2).all()
    assert (width[np.isin(kind, ["kernel", "memcpy", "memset"])] == 1).all()
    assert (lanes.first_node[kind == EventKind.CPU_OP.value] == -1).all()
    launches = edges[edges["kind"] == EdgeKind.LAUNCH.value]
    g = lanes.graph
    for src, dst in zip(launches["src"], launches["dst"], strict=True):  # each launch a lagged dependency
        at = slice(g.deps_ptr[lanes.first_node[dst]], g.deps_ptr[lanes.first_node[dst] + 1])
        assert lanes.first_node[src] in g.deps[at].tolist()


def test_dependencies_with_a_cycle_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call made before a launch on the same thread cannot wait for the launched kernel."""
    trace = read_gpu_trace(TRACES[[p.name for p in TRACES].index("event_sync.json.gz")])
    ev, edges = trace.events, dependencies(trace)
    launches = edges[edges["kind"] == EdgeKind.LAUNCH.value]
    calls = ev[ev["kind"] == EventKind.RUNTIME.value]

    def earlier_calls(call: int) -> pd.Index:
        return calls[
            (calls["tid"] == ev.at[call, "tid"]) & (calls["start_ns"] < ev.at[call, "start_ns"])
        ].index

    call, kernel = next(
        (c, k) for c, k in zip(launches["src"], launches["dst"], strict=True) if len(earlier_calls(c))
    )
    back = pd.DataFrame({"src": [kernel], "dst": [earlier_calls(call)[-1]], "kind": [EdgeKind.SYNC.value]})
    monkeypatch.setattr(gpu_lanes, "dependencies", lambda _: pd.concat([edges, back], ignore_index=True))
    with pytest.raises(ValueError, match="cycle"):
        simulate_lanes(trace)
