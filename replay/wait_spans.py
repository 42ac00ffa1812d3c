"""Emulated waits in the real rank's Kineto trace: when each virtual call was in flight.

The profiler sees a virtual call only as its short ``prism:comm`` mark: the wait for the virtual
peers happens later, inside ``Work.wait()``, where no op is recorded. After the run, one span per
profiled virtual call — from the call's return to its completion, as the comm log has them — is
added on a thread row of its own ("prism: emulated comm"), so Perfetto shows the waits beside
the rank's ops without breaking their nesting. Spans are placed on the trace's clock by the
median offset between each call's ``prism:comm`` mark and its logged enter time.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
from pathlib import Path

from prism.graph.kineto import read_json_file
from prism.schemas.annotations import Phase, try_parse_mark
from prism.schemas.comm_log import CommLog

WAIT_TID = 0x7072  # a thread id of its own for the emulated spans
WAIT_CATEGORY = "prism_emulated"
"""Category of the added spans: not ``user_annotation``, so trace readers that cut blocks skip them."""


def add_emulated_waits(kineto_path: Path, log: CommLog) -> int:
    """Add a span per profiled virtual call to the trace at ``kineto_path``; returns how many."""
    data = read_json_file(kineto_path)
    events = data["traceEvents"]
    base = int(data.get("baseTimeNanoseconds", 0))
    calls = {(c.label, c.gseq): c for c in log.calls if not c.delegated and c.done_ns > 0}
    marked, offsets, pid = [], [], None
    for e in events:
        if e.get("ph") != "X" or not str(e.get("name", "")).startswith("prism:comm"):
            continue
        mark = try_parse_mark(e["name"])
        call = None if mark is None or mark.phase != Phase.COMM else calls.get((mark.group, mark.gseq))
        if call is not None:
            marked.append(call)
            offsets.append(base + round(e["ts"] * 1000) - call.enter_ns)
            pid = e["pid"]
    if not marked:
        return 0
    offset = statistics.median(offsets)
    events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": WAIT_TID, "args": {"name": "prism: emulated comm"}})  # fmt: skip
    for call in marked:
        start, end = call.exit_ns + offset - base, call.done_ns + offset - base
        peer = "" if call.peer is None else f" peer {call.peer}"
        events.append(
            {
                "name": f"emulated {call.op} {call.label}{peer}",
                "cat": WAIT_CATEGORY,
                "ph": "X",
                "pid": pid,
                "tid": WAIT_TID,
                "ts": start / 1e3,
                "dur": max(end - start, 0) / 1e3,
                "args": {"gseq": call.gseq, "bytes": call.bytes, "async_op": call.async_op},
            }
        )
    _write_trace(kineto_path, data)
    return len(marked)


def _write_trace(path: Path, data: dict) -> None:
    """Rewrite the trace in place, gzipped like the profiler wrote it when its name ends in .gz."""
    raw = json.dumps(data).encode()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(gzip.compress(raw) if path.suffix == ".gz" else raw)
    os.replace(tmp, path)
