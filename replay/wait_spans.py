"""Emulated waits in the real rank's Kineto trace: when each virtual call was in flight.

The profiler sees a virtual call only as its short ``prism:comm`` mark: the wait for the virtual
peers happens later, inside ``Work.wait()``, where no op is recorded. After the run, one span per
profiled virtual call — from the call's return to its completion, as the comm log has them — is
added on a thread row of its own ("prism: emulated comm"), so Perfetto shows the waits beside
the rank's ops without breaking their nesting. Spans are placed on the trace's clock by the
median offset between each call's ``prism:comm`` mark and its logged enter time
(``TraceClock``); ``--trace-peers`` traces use the same mapping, so they line up with it.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

from prism.graph.traces.kineto import read_json_file
from prism.schemas.annotations import Phase, try_parse_mark
from prism.schemas.comm_log import CommCall, CommLog, trace_offset_ns

WAIT_TID = 0x7072  # a thread id of its own for the emulated spans
WAIT_CATEGORY = "prism_emulated"
"""Category of the added spans: not ``user_annotation``, so trace readers that cut blocks skip them."""


@dataclass(frozen=True, kw_only=True)
class TraceClock:
    """How a wall time (``time.time_ns()``) maps onto a Kineto trace's ``ts`` (µs)."""

    base_ns: int
    """The trace's ``baseTimeNanoseconds``."""
    offset_ns: int
    """Trace time minus wall time, from the calls' marks (median)."""
    pid: int
    """Process id of the trace's events."""

    def ts_us(self, wall_ns: int) -> float:
        # Integer arithmetic first: epoch nanoseconds exceed a float's precision.
        return (wall_ns + self.offset_ns - self.base_ns) / 1e3


def _marked_calls(events: list[dict], log: CommLog) -> list[tuple[dict, CommCall]]:
    """The trace's ``prism:comm`` marks of virtual calls, each with its call."""
    timed = [c for c in log.calls if not c.delegated and c.done_ns > 0]
    by_group = {(c.group, c.gseq): c for c in timed}
    by_label = {(c.label, c.gseq): c for c in timed}  # marks that name no process group
    found = []
    for e in events:
        if e.get("ph") != "X" or not str(e.get("name", "")).startswith("prism:comm"):
            continue
        mark = try_parse_mark(e["name"])
        if mark is None or mark.phase != Phase.COMM:
            continue
        call = (
            by_label.get((mark.group, mark.gseq)) if mark.pg is None else by_group.get((mark.pg, mark.gseq))
        )
        if call is not None:
            found.append((e, call))
    return found


def trace_clock(data: dict, log: CommLog) -> TraceClock | None:
    """The wall -> trace time mapping of a parsed Kineto trace, or None if it has no virtual call."""
    return _clock_of(data, _marked_calls(data["traceEvents"], log))


def _clock_of(data: dict, marked: list[tuple[dict, CommCall]]) -> TraceClock | None:
    if not marked:
        return None
    base = int(data.get("baseTimeNanoseconds", 0))
    offset = trace_offset_ns((base + round(e["ts"] * 1000), call.enter_ns) for e, call in marked)
    return TraceClock(base_ns=base, offset_ns=offset, pid=marked[0][0]["pid"])


def add_emulated_waits(kineto_path: Path, log: CommLog) -> TraceClock | None:
    """Add a span per profiled virtual call to the trace at ``kineto_path``; its clock, or None."""
    data = read_json_file(kineto_path)
    events = data["traceEvents"]
    marked = _marked_calls(events, log)
    clock = _clock_of(data, marked)
    if clock is None:
        return None
    pid = clock.pid
    events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": WAIT_TID, "args": {"name": "prism: emulated comm"}})  # fmt: skip
    for _, call in marked:
        peer = "" if call.peer is None else f" peer {call.peer}"
        events.append(
            {
                "name": f"emulated {call.op} {call.label}{peer}",
                "cat": WAIT_CATEGORY,
                "ph": "X",
                "pid": pid,
                "tid": WAIT_TID,
                "ts": clock.ts_us(call.exit_ns),
                "dur": max(call.done_ns - call.exit_ns, 0) / 1e3,
                "args": {"gseq": call.gseq, "bytes": call.bytes, "async_op": call.async_op},
            }
        )
    _write_trace(kineto_path, data)
    return clock


def _write_trace(path: Path, data: dict) -> None:
    """Rewrite the trace in place, gzipped like the profiler wrote it when its name ends in .gz."""
    raw = json.dumps(data).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    os.replace(tmp, path)
