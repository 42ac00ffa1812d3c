"""Read a Kineto Chrome trace into arrays and pick out the units of the training thread(s).

Read directly with ``json`` rather than through HTA's loader, which cannot serve here: HTA
0.5.0 drops ``[memory]`` events and ``args["Record function id"]`` (the ET join key), rounds
times to whole µs, keeps only the first ProfilerStep (iteration) of a trace by default, names
ops by symbol ids, and is several times slower per rank than ``read_kineto``.

Times: Kineto writes ``ts``/``dur`` in µs as floats with ns decimals; the absolute wall time
is ``baseTimeNanoseconds + ts * 1000``. Integer and fraction are split before scaling so that
the ns stay exact whatever the magnitude of ``ts``. A trace without ``baseTimeNanoseconds`` may
write absolute µs since the epoch, past what a float holds to the ns (2**41 µs): such a trace is
read again with exact decimals and its times made relative to its first whole µs
(``read_trace_events``), so that two calls back to back on a thread never overlap by a rounding.
"""

from __future__ import annotations

import gc
import gzip
import json
import zlib
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from prism.schemas.annotations import PREFIX, Mark, Phase, try_parse_mark


class NormalizeError(ValueError):
    """A capture file that cannot be turned into an op table; the message names the file."""


CPU_OP = "cpu_op"
USER_ANNOTATION = "user_annotation"
MEMORY_EVENT = "[memory]"
# Backward ops run through the autograd engine; on CUDA they run on a device thread of their own.
AUTOGRAD_OP_PREFIX = "autograd::engine::evaluate_function"


@dataclass(frozen=True)
class KinetoTrace:
    """The events of one trace that the op table needs."""

    path: Path
    """The trace file."""
    spans: pd.DataFrame
    """Complete events of cat cpu_op / user_annotation: name, cat, tid, start_ns, end_ns, rf_id."""
    memory: pd.DataFrame
    """``[memory]`` instants: tid, ts_ns, bytes, total, device_type, device_id, addr (time order),
    with the frees the profiler missed restored (``restore_unrecorded_frees``)."""


def read_json_file(path: Path, *, exact: bool = False) -> dict:
    """Parse a JSON file (gzipped when its name ends in .gz); one-line NormalizeError on failure.
    ``exact``: numbers with a fraction as ``Decimal``, as written."""
    if not path.is_file():
        raise NormalizeError(f"{path}: file is missing")
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        # The collector is pure overhead while building millions of small containers that all
        # survive: turning it off makes json.loads of a large ET several times faster.
        enabled = gc.isenabled()
        gc.disable()
        try:
            data = json.loads(raw, parse_float=Decimal) if exact else json.loads(raw)
        finally:
            if enabled:
                gc.enable()
    except (OSError, EOFError, zlib.error) as e:
        raise NormalizeError(f"{path}: cannot read ({type(e).__name__}: {e})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise NormalizeError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise NormalizeError(f"{path}: expected a JSON object at the top level")
    return data


def trace_ns(ts: list[float], base: int) -> np.ndarray:
    """Kineto times (µs, floats with ns decimals) as int64 ns after ``base``, exact to the ns."""
    t = np.asarray(ts, dtype=np.float64)
    whole = np.floor(t)
    return base + whole.astype(np.int64) * 1000 + np.rint((t - whole) * 1000).astype(np.int64)


FLOAT_NS_LIMIT_US = 2**41
"""Largest ``ts`` (µs) whose float still holds the ns: its spacing is under half a ns below it."""


def read_trace_events(path: Path) -> tuple[dict, list, int]:
    """A Kineto trace's document, its ``traceEvents`` and its time base (ns; 0 if unrecorded)."""
    data = read_json_file(path)
    events = data.get("traceEvents")
    if not isinstance(events, list):
        raise NormalizeError(f"{path}: no traceEvents list: not a Kineto trace")
    if "baseTimeNanoseconds" not in data and _latest_ts(events) >= FLOAT_NS_LIMIT_US:
        data = read_json_file(path, exact=True)
        events = data["traceEvents"]
        base = _rebase(events)  # before the other numbers become floats
        return _as_floats(data), events, base
    base = data.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool):
        raise NormalizeError(f"{path}: baseTimeNanoseconds is {base!r}, not an integer")
    return data, events, base


def _latest_ts(events: list) -> float:
    return max(
        (t for e in events if isinstance(e, dict) and isinstance(t := e.get("ts"), int | float)), default=0
    )


def _rebase(events: list) -> int:
    """Make every exact ``ts`` relative to the first whole µs (a float again, now exact to the
    ns); the base in ns."""
    starts = [t for e in events if isinstance(e, dict) and isinstance(t := e.get("ts"), int | Decimal)]
    base_us = int(min(starts))
    for e in events:
        if isinstance(e, dict) and isinstance(e.get("ts"), int | Decimal):
            e["ts"] = float(e["ts"] - base_us)
    return base_us * 1000


def _as_floats(value):
    """``value`` with every ``Decimal`` in it a float, in place where it is a container."""
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _as_floats(item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = _as_floats(item)
    elif isinstance(value, Decimal):
        return float(value)
    return value


def read_kineto(path: Path) -> KinetoTrace:
    """The spans and memory events of a Kineto trace."""
    _, events, base = read_trace_events(path)
    name, cat, tid, ts, dur, rf = [], [], [], [], [], []
    mtid, mts, mbytes, mtotal, mtype, mid, maddr = [], [], [], [], [], [], []
    try:
        for e in events:
            ph = e.get("ph")
            if ph == "X":
                c = e.get("cat")
                if c == CPU_OP or c == USER_ANNOTATION:
                    name.append(e["name"])
                    cat.append(c)
                    tid.append(int(e["tid"]))
                    ts.append(e["ts"])
                    dur.append(e.get("dur", 0.0))
                    rf.append(e.get("args", {}).get("Record function id", -1))
            elif ph == "i" and e.get("name") == MEMORY_EVENT:
                a = e["args"]
                mtid.append(int(e["tid"]))
                mts.append(e["ts"])
                mbytes.append(a["Bytes"])
                mtotal.append(a["Total Allocated"])
                mtype.append(a.get("Device Type", 0))
                mid.append(a.get("Device Id", -1))
                maddr.append(int(a.get("Addr", 0)))
    except (KeyError, TypeError, ValueError) as e:
        raise NormalizeError(f"{path}: malformed trace event ({type(e).__name__}: {e})") from e
    start = trace_ns(ts, base)
    spans = pd.DataFrame(
        {
            "name": name,
            "cat": cat,
            "tid": np.asarray(tid, dtype=np.int64),
            "start_ns": start,
            "end_ns": start + np.rint(np.asarray(dur, dtype=np.float64) * 1000).astype(np.int64),
            "rf_id": np.asarray(rf, dtype=np.int64),
        }
    )
    memory = pd.DataFrame(
        {
            "tid": np.asarray(mtid, dtype=np.int64),
            "ts_ns": trace_ns(mts, base),
            "bytes": np.asarray(mbytes, dtype=np.int64),
            "total": np.asarray(mtotal, dtype=np.int64),
            "device_type": np.asarray(mtype, dtype=np.int64),
            "device_id": np.asarray(mid, dtype=np.int64),
            "addr": np.asarray(maddr, dtype=np.int64),
        }
    )
    # Stable: events of one timestamp keep the allocator's order, so 'total' stays a running sum.
    memory = memory.sort_values("ts_ns", kind="stable", ignore_index=True)
    return KinetoTrace(path=path, spans=spans, memory=restore_unrecorded_frees(memory))


def restore_unrecorded_frees(memory: pd.DataFrame) -> pd.DataFrame:
    """Put back the frees the profiler did not record, and take them out of ``total``.

    The profiler records a free only on a thread it profiles. A block the training thread
    allocated and another thread freed (a gloo worker dropping a collective's tensor, on CPU)
    leaves no event, and the allocator's ``Total Allocated`` keeps counting it for the rest of the
    trace. Its address being allocated again shows that it was freed: a free of the block is
    inserted just before that allocation (tid -1) and every later total of the device lowered by
    its size. The block may have been freed any time before, so totals between its allocation
    and the new one are an upper bound; a block whose address never comes back stays counted.
    An event without ``Addr`` (address 0) is not tracked, nor a device whose totals already move
    apart from its events' bytes: its allocator counted every thread's frees
    (``prism.capture.cpu_allocator``), and its totals are right as they are.
    """
    if memory.empty or not memory["addr"].any():
        return memory
    device = [memory["device_type"], memory["device_id"]]
    step = memory.groupby(device)["total"].diff()
    moved = memory[step.notna() & (step != memory["bytes"])]
    counts_every_thread = set(zip(moved["device_type"], moved["device_id"], strict=True))
    live: dict[tuple[int, int, int], int] = {}
    restored: list[tuple[int, int]] = []  # (row of the allocation that reuses the address, size)
    keys = zip(
        memory["device_type"].tolist(), memory["device_id"].tolist(), memory["addr"].tolist(), strict=True
    )
    for row, (key, nbytes) in enumerate(zip(keys, memory["bytes"].tolist(), strict=True)):
        if key[2] == 0 or key[:2] in counts_every_thread:
            continue
        if nbytes > 0:
            if key in live:
                restored.append((row, live[key]))
            live[key] = nbytes
        elif nbytes < 0:
            live.pop(key, None)
    if not restored:
        return memory
    rows = np.array([r for r, _ in restored])
    frees = memory.iloc[rows].copy()
    frees["bytes"] = -np.array([b for _, b in restored], dtype=np.int64)
    frees["tid"] = -1
    # Each device's totals drop by what was restored on it up to and including that row.
    freed = np.zeros(len(memory), dtype=np.int64)
    freed[rows] = -frees["bytes"].to_numpy()
    lowered = memory.assign(total=memory["total"] - pd.Series(freed).groupby(device).cumsum())
    frees["total"] = lowered["total"].to_numpy()[rows] - memory["bytes"].to_numpy()[rows]
    # A free sorts just before the allocation that reuses its address.
    order = np.concatenate([np.arange(len(memory)) * 2 + 1, rows * 2])
    merged = pd.concat([lowered, frees], ignore_index=True)
    return merged.iloc[np.argsort(order, kind="stable")].reset_index(drop=True)


@dataclass(frozen=True)
class Marks:
    """The prism marks of a trace, parsed."""

    iterations: pd.DataFrame
    """iteration, start_ns, end_ns, tid of every prism:iter mark, in time order."""
    blocks: list[tuple[int, int, Mark]]
    """(start_ns, end_ns, mark) of every other non-comm mark, in time order."""


def find_marks(trace: KinetoTrace) -> Marks:
    """Parse every ``prism:`` annotation; at least one iteration mark is required."""
    spans = trace.spans
    ann = spans[(spans["cat"] == USER_ANNOTATION) & spans["name"].str.startswith(PREFIX)]
    parsed = [try_parse_mark(n) for n in ann["name"]]
    rows, blocks = [], []
    for m, s, e, t in zip(parsed, ann["start_ns"], ann["end_ns"], ann["tid"], strict=True):
        if m is None or m.phase is Phase.COMM:
            continue
        if m.phase is Phase.ITERATION:
            rows.append((m.iter, s, e, t))
        else:
            blocks.append((int(s), int(e), m))
    if not rows:
        raise NormalizeError(f"{trace.path}: no prism:iter marks: nothing to normalize")
    its = pd.DataFrame(rows, columns=["iteration", "start_ns", "end_ns", "tid"]).sort_values("start_ns")
    if its["iteration"].duplicated().any():
        raise NormalizeError(f"{trace.path}: an iteration is marked twice")
    if (its["start_ns"].to_numpy()[1:] < its["end_ns"].to_numpy()[:-1]).any():
        raise NormalizeError(f"{trace.path}: prism:iter marks overlap")
    blocks.sort(key=lambda b: (b[0], -b[1]))
    return Marks(iterations=its.reset_index(drop=True), blocks=blocks)


def window_index(times: np.ndarray, iterations: pd.DataFrame) -> np.ndarray:
    """Row of ``iterations`` whose [start, end) holds each time, or -1."""
    starts = iterations["start_ns"].to_numpy()
    ends = iterations["end_ns"].to_numpy()
    i = np.searchsorted(starts, times, side="right") - 1
    inside = (i >= 0) & (times < ends[np.maximum(i, 0)])
    return np.where(inside, i, -1)


def training_spans(trace: KinetoTrace, iterations: pd.DataFrame) -> pd.DataFrame:
    """cpu_ops and prism:comm marks of the training thread(s), lying wholly inside an iteration.

    The training threads are the thread of the iteration marks plus any thread running autograd
    ops inside the iterations (CUDA runs backward on a device thread; on CPU it is the caller's).
    """
    spans = trace.spans
    main = set(iterations["tid"])
    # A call's mark is a cpu_op (prism's process group) or, in older captures, a user annotation.
    is_comm = spans["cat"].isin((USER_ANNOTATION, CPU_OP)) & spans["name"].str.startswith(
        PREFIX + Phase.COMM.value + "|"
    )
    keep = is_comm | (spans["cat"] == CPU_OP)
    spans = spans[keep].assign(is_comm=is_comm[keep])
    win = window_index(spans["start_ns"].to_numpy(), iterations)
    ends = iterations["end_ns"].to_numpy()
    inside = (win >= 0) & (spans["end_ns"].to_numpy() <= ends[np.maximum(win, 0)])
    spans = spans[inside].assign(window=win[inside])
    autograd = spans["name"].str.startswith(AUTOGRAD_OP_PREFIX)
    threads = main | set(spans.loc[autograd, "tid"])
    return spans[spans["tid"].isin(threads)]


def select_units(spans: pd.DataFrame) -> pd.DataFrame:
    """The units among ``spans`` (see ``training_spans``), in start order.

    A unit is a comm mark, or a cpu_op that is inside no comm mark, contains none, and is
    contained in no other such cpu_op. A cpu_op that *contains* a comm mark (the autograd
    Function wrapping a tensor-parallel all-reduce, or its backward) is opened up: its children
    become candidates, so that the call stands as a unit of its own.
    """
    parts = [_thread_units(g) for _, g in spans.groupby("tid", sort=False)]
    if not parts:
        return spans.iloc[:0]
    return pd.concat(parts).sort_values(["start_ns", "end_ns"], kind="stable")


def _thread_units(g: pd.DataFrame) -> pd.DataFrame:
    comm = g[g["is_comm"]].sort_values(["start_ns", "end_ns"], ascending=[True, False])
    cs, ce = comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy()
    # A comm mark inside another is part of that call (none are in the GPT workload).
    comm = comm[~_contained(cs, ce)]
    cs, ce = comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy()
    ops = g[~g["is_comm"]]
    s, e = ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy()
    if len(cs):
        j = np.maximum(np.searchsorted(cs, s, side="right") - 1, 0)
        inside = (cs[j] <= s) & (e <= ce[j])
        k = np.minimum(np.searchsorted(cs, s, side="left"), len(cs) - 1)
        opened = (cs[k] >= s) & (ce[k] <= e) & ~inside
        # An op that straddles a call's start or end (a dispatch mode's op around the start of the
        # collective it dispatches, closed before the call returns) is no unit: its time is gap.
        straddles = ((s < cs[k]) & (cs[k] < e) & (e < ce[k])) | ((cs[j] <= s) & (s < ce[j]) & (ce[j] < e))
        ops = ops[~inside & ~opened & ~straddles]
    cand = pd.concat([ops, comm])
    cand = cand.iloc[np.lexsort((-cand["end_ns"].to_numpy(), cand["start_ns"].to_numpy()))]
    return cand[~_contained(cand["start_ns"].to_numpy(), cand["end_ns"].to_numpy())]


def _contained(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For spans sorted by (start, -end) on one thread: True where an earlier span holds it."""
    if len(starts) == 0:
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(ends)
    before = np.concatenate(([np.iinfo(np.int64).min], reach[:-1]))
    return starts < before
