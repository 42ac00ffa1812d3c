"""Emulated waits added to a real rank's Kineto trace: one span per profiled virtual call, on the trace's clock."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from prism.graph.traces.kineto import read_kineto
from prism.replay.wait_spans import WAIT_CATEGORY, WAIT_TID, add_emulated_waits
from prism.schemas.annotations import Mark, Phase, format_mark
from prism.schemas.comm_log import CommCall, CommLog

BASE_NS = 1_700_000_000_000_000_000  # the trace's baseTimeNanoseconds
SKEW_NS = 2_500  # the trace's clock runs 2.5 µs ahead of the comm log's


def call(gseq: int, enter_ns: int, *, delegated: bool = False) -> CommCall:
    return CommCall(
        seq=gseq, op="all_reduce", group="1", label="tp.0", group_size=2, gseq=gseq, bytes=64, dtype="float32",
        shape=(16,), enter_ns=enter_ns, exit_ns=enter_ns + 10_000, done_ns=enter_ns + 510_000, delegated=delegated,
    )  # fmt: skip


def mark_event(c: CommCall) -> dict:
    name = format_mark(Mark(phase=Phase.COMM, op=c.op, group=c.label, gseq=c.gseq, bytes=c.bytes))
    ts_us = (c.enter_ns + SKEW_NS - BASE_NS) / 1e3
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 7, "tid": 7, "ts": ts_us, "dur": 10.0}


def write_trace(path: Path, events: list[dict]) -> None:
    path.write_bytes(
        gzip.compress(json.dumps({"traceEvents": events, "baseTimeNanoseconds": BASE_NS}).encode())
    )


def test_each_profiled_virtual_call_gets_a_span_from_its_return_to_its_completion(tmp_path: Path) -> None:
    t0 = BASE_NS + 5_000_000
    profiled = [call(1, t0), call(2, t0 + 2_000_000)]
    unprofiled = call(0, t0 - 3_000_000)  # before the profiled window: no mark in the trace
    trace = tmp_path / "rank0.trace.json.gz"
    write_trace(trace, [mark_event(c) for c in profiled])
    log = CommLog(rank=0, world_size=2, calls=(unprofiled, *profiled))

    clock = add_emulated_waits(trace, log)
    assert clock is not None and clock.offset_ns == SKEW_NS and clock.pid == 7

    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    spans = [e for e in events if e.get("cat") == WAIT_CATEGORY]
    assert [e["args"]["gseq"] for e in spans] == [1, 2]
    for e, c in zip(spans, profiled, strict=True):
        assert (e["pid"], e["tid"]) == (7, WAIT_TID)  # a row of its own, beside the rank's ops
        assert round(e["ts"] * 1e3) == c.exit_ns + SKEW_NS - BASE_NS  # on the trace's clock
        assert round(e["dur"] * 1e3) == c.done_ns - c.exit_ns
    assert len(read_kineto(trace).spans) == 2  # readers that cut blocks see only the marks


def test_delegated_calls_and_traces_without_marks_are_left_alone(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.trace.json.gz"
    write_trace(trace, [])
    before = trace.read_bytes()
    assert (
        add_emulated_waits(trace, CommLog(rank=0, world_size=2, calls=(call(0, BASE_NS, delegated=True),)))
        is None
    )
    assert trace.read_bytes() == before
