"""Read a GPU rank's Kineto trace into what runs where and what waits for what.

A GPU rank's iteration is set by dependencies the CPU trace alone does not show: the CPU
launching work onto a stream, work in order on each stream, a stream waiting for an event
another stream recorded, and the CPU blocking until GPU work is done. ``read_gpu_trace`` takes
from a Kineto trace (recorded by ``torch.profiler`` with CUDA activities, by prism or by anyone)

- the events: CPU ops, CUDA runtime calls, and the GPU's kernels, memcpys and memsets, each on
  its (device, stream), with its correlation id (runtime call <-> GPU work);
- the ``cuda_sync`` records Kineto writes for each synchronization (which stream, which
  ``cudaEventRecord`` it waits for), the ``ProfilerStep`` spans, and the collectives'
  ``record_param_comms`` annotations;

and ``dependencies`` derives the edges between events:

- ``launch``: the runtime call -> the GPU work it launched (same correlation id);
- ``stream``: GPU work -> the next GPU work on the same stream;
- ``stream_wait``: ``cudaStreamWaitEvent``: the last work launched on the recording stream
  before its ``cudaEventRecord`` -> the first work launched on the waiting stream after the wait;
- ``sync``: ``cudaStreamSynchronize`` / ``cudaEventSynchronize`` / ``cudaDeviceSynchronize``:
  the GPU work waited for -> the runtime call, which cannot return before it ends (a blocking
  device-to-host copy is a ``cudaMemcpyAsync`` followed by such a sync, as torch makes it);
- ``comm``: a collective's ``record_param_comms`` op -> the NCCL kernel launched inside it.

Times are ns as in ``prism.graph.traces.kineto`` (Kineto's µs floats, exact to the ns).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from prism.graph.traces.kineto import CPU_OP, USER_ANNOTATION, NormalizeError, read_trace_events, trace_ns


class EventKind(enum.StrEnum):
    CPU_OP = "cpu_op"
    RUNTIME = "runtime"
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"


GPU_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET)
_CATEGORIES = {
    CPU_OP: EventKind.CPU_OP,
    "cuda_runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.RUNTIME,  # cuLaunchKernel and the like: launches too
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
}

LEGACY_CATEGORIES = {
    "Operator": CPU_OP,
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
}
"""The categories of Kineto's traces before its schema was versioned (2021: TensorBoard's
profiler samples), by today's names; their ``ProfilerStep#N`` spans are ``Operator`` events and
their runtime calls' and GPU work's args say ``external id``."""


class EdgeKind(enum.StrEnum):
    LAUNCH = "launch"
    STREAM = "stream"
    STREAM_WAIT = "stream_wait"
    SYNC = "sync"
    COMM = "comm"


class SyncKind(enum.StrEnum):
    """Kineto's ``cuda_sync_kind``."""

    STREAM_WAIT_EVENT = "Stream Wait Event"
    EVENT_SYNC = "Event Sync"
    STREAM_SYNC = "Stream Sync"
    CONTEXT_SYNC = "Context Sync"


EVENT_RECORD = "cudaEventRecord"
BLOCKING_CALLS = {
    SyncKind.EVENT_SYNC: "cudaEventSynchronize",  # not cudaEventQuery: a poll waits for nothing
    SyncKind.STREAM_SYNC: "cudaStreamSynchronize",
    SyncKind.CONTEXT_SYNC: "cudaDeviceSynchronize",
}
COMM_OP = "record_param_comms"
PROFILER_STEP = "ProfilerStep#"


@dataclass(frozen=True)
class GpuTrace:
    """One rank's trace: its events and what Kineto recorded about their synchronization."""

    path: Path
    rank: int | None
    """``distributedInfo.rank``, if recorded."""
    world_size: int | None
    """``distributedInfo.world_size``, if recorded."""
    device_name: str | None
    """The first GPU's name in ``deviceProperties`` ("NVIDIA A100-SXM4-80GB"), if recorded."""
    events: pd.DataFrame
    """One row per event, in start order: kind (``EventKind``), name, tid (CPU thread; -1 on the
    GPU), device, stream (-1 on the CPU), start_ns, end_ns, correlation (-1: none), external_id."""
    syncs: pd.DataFrame
    """One row per ``cuda_sync`` record: correlation (its runtime call's), sync_kind, device,
    stream (a stream wait's waiting stream), wait_on_stream, event_correlation (the
    ``cudaEventRecord`` waited for; -1: none)."""
    steps: pd.DataFrame
    """``ProfilerStep#N`` spans: step, tid (the thread that marked it), start_ns, end_ns, in order."""
    collectives: pd.DataFrame
    """One row per ``record_param_comms`` op: event (row of ``events``), collective, in_nelems,
    out_nelems, dtype, group_size, group_ranks, group_name."""


NOT_A_TIMELINE = {
    "cuda_profiler_range": "CUPTI's range profiler replays each kernel alone for its counters",
    "mtia_runtime": "another accelerator's runtime (MTIA)",
}
"""Categories of traces that hold device work prism does not read as a GPU timeline, and why."""


def _holds(categories: Counter) -> str:
    """What a trace without GPU events holds: its event categories, most first, and why one that
    looks like device work is not read."""
    held = ", ".join(f"{n:,} {cat}" for cat, n in categories.most_common(4) if cat)
    why = [NOT_A_TIMELINE[cat] for cat in categories if cat in NOT_A_TIMELINE]
    return f"it holds {held or 'no complete events'}" + (f": {why[0]}" if why else "")


def read_gpu_trace(path: Path) -> GpuTrace:
    """The events of a Kineto trace with GPU activities; a one-line ``NormalizeError`` otherwise."""
    data, raw, base = read_trace_events(path)
    rows: list[tuple] = []
    syncs: list[tuple] = []
    steps: list[tuple] = []
    comm_args: dict[int, dict] = {}  # row -> args of a record_param_comms op
    try:
        for e in raw:
            if not isinstance(e, dict):
                raise TypeError(f"an event is {type(e).__name__}, not an object")
            if e.get("ph") != "X":
                continue
            cat, name, args = e.get("cat"), e.get("name", ""), e.get("args") or {}
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError("an event's name is not a string or its args not an object")
            if cat in LEGACY_CATEGORIES:
                cat = USER_ANNOTATION if name.startswith(PROFILER_STEP) else LEGACY_CATEGORIES[cat]
            if cat == "cuda_sync":
                syncs.append((
                    int(args.get("correlation", -1)), args.get("cuda_sync_kind", name), int(args.get("device", -1)),
                    int(args.get("stream", -1)), int(args.get("wait_on_stream", -1)),
                    int(args.get("wait_on_cuda_event_record_corr_id", -1)),
                ))  # fmt: skip
                continue
            if cat == USER_ANNOTATION and name.startswith(PROFILER_STEP):
                steps.append((int(name[len(PROFILER_STEP) :]), _tid(e["tid"]), *_times(e)))
                continue
            kind = _CATEGORIES.get(cat)
            if kind is None:
                continue
            on_gpu = kind in GPU_KINDS
            if kind is EventKind.CPU_OP and name == COMM_OP:
                comm_args[len(rows)] = args
            rows.append((
                kind.value, name, -1 if on_gpu else _tid(e["tid"]), int(args.get("device", -1)),
                int(args.get("stream", -1)) if on_gpu else -1, *_times(e),
                int(args.get("correlation", -1)), int(args.get("External id", args.get("external id", -1))),
            ))  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise NormalizeError(f"{path}: malformed trace event ({type(e).__name__}: {e})") from e
    if not any(r[0] in GPU_KINDS for r in rows):
        categories = Counter(e.get("cat") for e in raw if e.get("ph") == "X")  # counted only to refuse
        raise NormalizeError(
            f"{path}: no GPU kernels, memcpys or memsets: not a GPU trace ({_holds(categories)})"
        )
    events = _events(rows, base)
    info = data.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    return GpuTrace(
        path=path,
        rank=_int_or_none(info.get("rank")),
        world_size=_int_or_none(info.get("world_size")),
        device_name=_device_name(data.get("deviceProperties")),
        events=events,
        syncs=pd.DataFrame(
            syncs,
            columns=["correlation", "sync_kind", "device", "stream", "wait_on_stream", "event_correlation"],
        ),
        steps=_steps(steps, base),
        collectives=_collectives(comm_args, events),
    )


def _device_name(properties: object) -> str | None:
    first = properties[0] if isinstance(properties, list) and properties else None
    name = first.get("name") if isinstance(first, dict) else None
    return name if isinstance(name, str) and name else None


def _times(e: dict) -> tuple[float, float]:
    ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
    if not (math.isfinite(ts) and math.isfinite(dur) and dur >= 0):
        raise ValueError(f"ts {ts}, dur {dur}")
    return ts, dur


def _tid(tid: object) -> int:
    # Kineto writes CPU threads as ints; a few traces write a string ("thread 7 (python)").
    return int(tid) if isinstance(tid, int) or str(tid).lstrip("-").isdigit() else hash(tid) & 0x7FFFFFFF


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, int | float | str) and str(value).lstrip("-").isdigit() else None


def _events(rows: list[tuple], base: int) -> pd.DataFrame:
    columns = ["kind", "name", "tid", "device", "stream", "ts", "dur", "correlation", "external_id"]
    df = pd.DataFrame(rows, columns=columns)
    df["start_ns"] = trace_ns(df["ts"].tolist(), base)
    df["end_ns"] = df["start_ns"] + np.rint(df["dur"].to_numpy(dtype=np.float64) * 1000).astype(np.int64)
    df = df.drop(columns=["ts", "dur"])
    df["read"] = np.arange(len(df))  # the order read: where record_param_comms' args were kept
    # Original order of equal starts kept: a parent op before the child that starts with it.
    return df.sort_values("start_ns", kind="stable", ignore_index=True)


def _steps(steps: list[tuple], base: int) -> pd.DataFrame:
    if not steps:
        return pd.DataFrame({c: pd.Series(dtype=np.int64) for c in ("step", "tid", "start_ns", "end_ns")})
    step, tid, ts, dur = zip(*steps, strict=True)
    start = trace_ns(list(ts), base)
    end = start + np.rint(np.asarray(dur, dtype=np.float64) * 1000).astype(np.int64)
    steps_df = pd.DataFrame({"step": step, "tid": tid, "start_ns": start, "end_ns": end})
    return steps_df.sort_values("start_ns", ignore_index=True)


def _collectives(comm_args: dict[int, dict], events: pd.DataFrame) -> pd.DataFrame:
    """The record_param_comms ops, by their row in ``events`` (rows were re-sorted by start)."""
    position = pd.Series(np.arange(len(events)), index=events["read"].to_numpy())
    out = []
    for raw_row, a in comm_args.items():
        out.append({
            "event": int(position[raw_row]),
            "collective": a.get("Collective name", ""),
            "in_nelems": int(a.get("In msg nelems", -1)),
            "out_nelems": int(a.get("Out msg nelems", -1)),
            "dtype": a.get("dtype", ""),
            "group_size": int(a.get("Group size", -1)),
            "group_ranks": a.get("Process Group Ranks", ""),
            "group_name": a.get("Process Group Name", ""),
        })  # fmt: skip
    columns = [
        "event",
        "collective",
        "in_nelems",
        "out_nelems",
        "dtype",
        "group_size",
        "group_ranks",
        "group_name",
    ]
    return pd.DataFrame(out, columns=columns).sort_values("event", ignore_index=True)


# -- dependencies ---------------------------------------------------------------------------------


def dependencies(trace: GpuTrace) -> pd.DataFrame:
    """Edges ``src -> dst`` (rows of ``trace.events``) with their ``kind`` (``EdgeKind``): ``dst``
    cannot start (``launch``, ``stream``, ``stream_wait``, ``comm``) or end (``sync``) before
    ``src`` ends, or for ``launch`` and ``comm`` before ``src`` starts."""
    ev = trace.events
    gpu = ev[ev["kind"].isin([k.value for k in GPU_KINDS])]
    runtime = ev[ev["kind"] == EventKind.RUNTIME.value]
    launches = _launches(runtime, gpu)
    calls = _runtime_by_correlation(runtime)
    parts = [
        launches.rename(columns={"runtime": "src", "gpu": "dst"}).assign(kind=EdgeKind.LAUNCH.value),
        _stream_order(gpu),
        _stream_waits(trace.syncs, calls, gpu, launches),
        _syncs(trace.syncs, calls, gpu, launches),
        _comm(trace, runtime, launches),
    ]
    edges = pd.concat([p[["src", "dst", "kind"]] for p in parts], ignore_index=True)
    return edges.astype({"src": np.int64, "dst": np.int64}).sort_values(["dst", "src"], ignore_index=True)


def _launches(runtime: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """runtime row, gpu row, launch start (ns) of every GPU event whose runtime call is in the trace."""
    r = pd.DataFrame(
        {"runtime": runtime.index, "correlation": runtime["correlation"], "launched_ns": runtime["start_ns"]}
    )
    g = pd.DataFrame({"gpu": gpu.index, "correlation": gpu["correlation"]})
    r = r[r["correlation"] >= 0].drop_duplicates("correlation")
    return g.merge(r, on="correlation")[["runtime", "gpu", "launched_ns"]]


def _stream_order(gpu: pd.DataFrame) -> pd.DataFrame:
    ordered = gpu.sort_values(["device", "stream", "start_ns"], kind="stable")
    same = (ordered["device"].to_numpy()[1:] == ordered["device"].to_numpy()[:-1]) & (
        ordered["stream"].to_numpy()[1:] == ordered["stream"].to_numpy()[:-1]
    )
    rows = ordered.index.to_numpy()
    return pd.DataFrame({"src": rows[:-1][same], "dst": rows[1:][same], "kind": EdgeKind.STREAM.value})


def _on_stream(gpu: pd.DataFrame, launches: pd.DataFrame, device: int, stream: int) -> pd.DataFrame:
    """GPU events of one stream with their launch times, in launch order."""
    mine = gpu[(gpu["stream"] == stream) & ((gpu["device"] == device) | (device < 0))]
    return launches[launches["gpu"].isin(mine.index)].sort_values("launched_ns")


def _last_launched_before(work: pd.DataFrame, t_ns: int) -> int | None:
    before = work[work["launched_ns"] < t_ns]
    return None if before.empty else int(before["gpu"].iloc[-1])


def _runtime_by_correlation(runtime: pd.DataFrame) -> pd.DataFrame:
    """The runtime calls by correlation id, each with its row of the events (``row``)."""
    calls = runtime[runtime["correlation"] >= 0].drop_duplicates("correlation")
    return calls.rename_axis("row").reset_index().set_index("correlation")


def _stream_waits(
    syncs: pd.DataFrame, calls: pd.DataFrame, gpu: pd.DataFrame, launches: pd.DataFrame
) -> pd.DataFrame:
    out = []
    for s in syncs[syncs["sync_kind"] == SyncKind.STREAM_WAIT_EVENT.value].itertuples():
        if s.event_correlation not in calls.index or s.correlation not in calls.index:
            continue
        recorded = calls.loc[s.event_correlation, "start_ns"]
        src = _last_launched_before(_on_stream(gpu, launches, s.device, s.wait_on_stream), recorded)
        waiting = _on_stream(gpu, launches, s.device, s.stream)
        after = waiting[waiting["launched_ns"] > calls.loc[s.correlation, "start_ns"]]
        if src is not None and not after.empty:
            out.append((src, int(after["gpu"].iloc[0])))
    return pd.DataFrame(out, columns=["src", "dst"]).assign(kind=EdgeKind.STREAM_WAIT.value)


def _syncs(
    syncs: pd.DataFrame, calls: pd.DataFrame, gpu: pd.DataFrame, launches: pd.DataFrame
) -> pd.DataFrame:
    out = []
    for s in syncs.itertuples():
        blocking = BLOCKING_CALLS.get(s.sync_kind)
        if blocking is None or s.correlation not in calls.index:
            continue
        call = calls.loc[s.correlation]
        if call["name"] != blocking:
            continue
        dst = int(call["row"])
        if s.sync_kind == SyncKind.EVENT_SYNC.value:
            if s.event_correlation not in calls.index:
                continue
            waited = [(s.wait_on_stream, calls.loc[s.event_correlation, "start_ns"])]
        elif s.sync_kind == SyncKind.STREAM_SYNC.value:
            waited = [(s.stream, call["start_ns"])]
        else:  # the whole device: every stream's last work
            streams = gpu.loc[(gpu["device"] == s.device) | (s.device < 0), "stream"].unique()
            waited = [(int(stream), call["start_ns"]) for stream in streams]
        for stream, t_ns in waited:
            src = _last_launched_before(_on_stream(gpu, launches, s.device, stream), t_ns)
            if src is not None:
                out.append((src, dst))
    return pd.DataFrame(out, columns=["src", "dst"]).assign(kind=EdgeKind.SYNC.value)


def _comm(trace: GpuTrace, runtime: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """Each collective's op -> the kernels launched from inside it on its thread."""
    ev = trace.events
    out = []
    for c in trace.collectives.itertuples():
        op = ev.loc[c.event]
        inside = runtime[
            (runtime["tid"] == op["tid"])
            & (runtime["start_ns"] >= op["start_ns"])
            & (runtime["end_ns"] <= op["end_ns"])
        ]
        kernels = launches[launches["runtime"].isin(inside.index)]
        kernels = kernels[ev.loc[kernels["gpu"], "kind"].to_numpy() == EventKind.KERNEL.value]
        out += [(c.event, int(k)) for k in kernels["gpu"]]
    return pd.DataFrame(out, columns=["src", "dst"]).assign(kind=EdgeKind.COMM.value)
