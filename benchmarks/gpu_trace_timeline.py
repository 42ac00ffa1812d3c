"""Each ProfilerStep of GPU traces against the same step simulated from the trace's dependencies.

    .venv/bin/python benchmarks/gpu_trace_timeline.py [TRACE ...]

For each Kineto trace (default: the public GPU traces with ProfilerSteps in tests/data/gpu_traces),
reads its events and dependency edges (``prism.graph.traces.gpu``), fits the rank's launch and
stream delays, simulates its timeline (``prism.graph.traces.gpu_timeline``'s model, on the
simulation engine: ``prism.graph.build.gpu_lanes``) and prints, per step, the step and its GPU
work as recorded and as simulated.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.graph.build.gpu_lanes import simulate_lanes
from prism.graph.traces.gpu import read_gpu_trace
from prism.graph.traces.gpu_timeline import step_times

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu_traces"
DEFAULT = [DATA / "event_sync.json.gz", DATA / "nccl_ddp_rank0.json.gz"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, default=DEFAULT)
    args = parser.parse_args()
    table = Table(title="ProfilerSteps: recorded vs simulated from the trace's dependencies")
    columns = ("trace", "events", "edges", "launch µs", "stream µs", "step", "recorded ms", "simulated ms", "err %",
               "GPU work recorded ms", "simulated ms", "err %")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for path in args.traces:
        trace = read_gpu_trace(path)
        timeline = simulate_lanes(trace)
        model, edges = timeline.model, timeline.edges
        for s in step_times(trace, timeline).itertuples():
            table.add_row(
                path.name, f"{len(trace.events):,}", f"{len(edges):,}", f"{model.launch_ns / 1e3:.1f}",
                f"{model.stream_ns / 1e3:.1f}", str(s.step), f"{s.recorded_ms:.3f}", f"{s.simulated_ms:.3f}",
                f"{s.err_pct:+.3f}", f"{s.gpu_recorded_ms:.3f}", f"{s.gpu_simulated_ms:.3f}", f"{s.gpu_err_pct:+.3f}",
            )  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
