"""Chrome-trace JSON of a virtual rank as the co-simulation ran it (``prism-replay --trace-peers``).

One complete event ("ph": "X") per node, on the real rank's Kineto trace clock
(``prism.replay.wait_spans.TraceClock``), so that Perfetto or chrome://tracing, given both
files, shows the virtual neighbours beside the real rank. Process id = global rank; thread 0 =
its main stream. Without a trace clock (no profiled virtual call), times are wall-clock µs.
"""

from __future__ import annotations

from pathlib import Path

from prism.graph.sim_engine import COMPUTE
from prism.replay.graph_clock import GraphClock, RankProgram
from prism.replay.wait_spans import TraceClock
from prism.schemas.files import write_json_atomic


def peer_trace_events(clock: GraphClock, program: RankProgram, trace: TraceClock | None = None) -> list[dict]:
    """Trace events of ``program``'s rank in every iteration the clock recorded."""
    ts_us = trace.ts_us if trace is not None else (lambda wall_ns: wall_ns / 1e3)
    rank = program.rank
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} (virtual)"}}
    ]
    for iteration, times in enumerate(clock.traced):
        for k, (start, end) in enumerate(zip(times.start_ns[rank], times.end_ns[rank], strict=True)):
            name = str(program.name[k]) if program.kind[k] == COMPUTE else program.describe(k)
            events.append(
                {
                    "name": name,
                    "cat": str(program.phase[k]) or "node",
                    "ph": "X",
                    "pid": rank,
                    "tid": 0,
                    "ts": ts_us(int(start)),
                    "dur": max(int(end) - int(start), 0) / 1e3,
                    "args": {"iteration": iteration, "node": k},
                }
            )
    return events


def write_peer_trace(
    clock: GraphClock, program: RankProgram, path: Path, trace: TraceClock | None = None
) -> None:
    events = peer_trace_events(clock, program, trace)
    write_json_atomic(path, {"traceEvents": events, "displayTimeUnit": "ms"}, indent=None)
