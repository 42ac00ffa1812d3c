"""Chrome-trace JSON of a virtual rank as the co-simulation ran it (``prism-replay --trace-peers``).

One complete event ("ph": "X") per node, on the real rank's Kineto trace clock
(``prism.replay.wait_spans.TraceClock``), so that Perfetto or chrome://tracing, given both
files, shows the virtual neighbours beside the real rank. Process id = global rank; thread 0 =
its main stream. Without a trace clock (no profiled virtual call), times are wall-clock µs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prism.graph.sim.engine import COMPUTE
from prism.replay.rank_program import RankProgram
from prism.replay.wait_spans import TraceClock
from prism.schemas.files import write_json_atomic
from prism.schemas.layout import ParallelLayout

PassTimes = tuple[dict[int, np.ndarray], dict[int, np.ndarray]]
"""(start, end) graph ns of the nodes of traced ranks in one pass (``CoSimulation.traced``)."""


def peer_trace_events(
    traced: Sequence[PassTimes],
    wall_offsets: Sequence[int],
    program: RankProgram,
    trace: TraceClock | None = None,
) -> list[dict]:
    """Trace events of ``program``'s rank in every pass; ``wall_offsets`` map each to the wall.

    A pass is mapped with the real rank's stall shift at its end, so nodes early in an
    iteration that stalled may show up to that stall late."""
    ts_us = trace.ts_us if trace is not None else (lambda wall_ns: wall_ns / 1e3)
    rank = program.rank
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} (virtual)"}}
    ]
    for iteration, ((starts, ends), offset) in enumerate(zip(traced, wall_offsets, strict=False)):
        for k, (start, end) in enumerate(zip(starts[rank] + offset, ends[rank] + offset, strict=True)):
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
    traced: Sequence[PassTimes], wall_offsets: Sequence[int], program: RankProgram, layout: ParallelLayout,
    path: Path, trace: TraceClock | None = None,
) -> None:  # fmt: skip
    events = peer_trace_events(traced, wall_offsets, program, trace)
    info = layout.distributed_info(program.rank)  # HTA loads it beside the real rank's by this
    write_json_atomic(
        path, {"distributedInfo": info, "traceEvents": events, "displayTimeUnit": "ms"}, indent=None
    )
