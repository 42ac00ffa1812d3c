"""Turn one captured rank's Kineto trace + Execution Trace + comm log into an op table.

The op table (columns in ``prism.graph.build.op_table``) has one row per *unit* of the rank's
training thread in its profiled iterations (inside ``prism:iter`` marks), in program order:

- a top-level cpu_op, or
- a process-group call: a ``prism:comm`` mark, the backend's ops inside it absorbed, joined to
  its ``CommCall`` of the comm log on (group name, gseq), or
- the iteration's end (``ITERATION_END``): from its last unit's end to the end of its mark. On
  CUDA that is where the iteration waits for its device work (the capture synchronizes there,
  in a runtime call that is no cpu_op), often the larger part of a GPU-bound iteration.

A cpu_op that contains a comm mark (``_ReduceFromTP`` around the tensor-parallel all-reduce,
``autograd::engine::evaluate_function: _CopyToTPBackward`` around its backward one) is opened:
its children are the units, so every call stands alone; the wrapper's own time goes to gaps.

Enclosing marks are those that hold each unit's *last ns* (``max(start, end - 1)``). Backward
marks come from gradient hooks, which run as pre-hooks of the first autograd node of the
block that begins: the hook closes the previous block's range and opens the next one a little
way into that node's ``evaluate_function`` op. So the op that straddles a boundary is the first
op of the block whose mark holds its end. Forward marks nest properly, where any point of
the unit gives the same answer.

Gaps and durations leave out the time prism held the program (``HeldTime``: a paced capture's
emulated waits and engine work; none in a free-running capture).

Reading goes through ``json`` directly, not HTA (see ``prism.graph.traces.kineto``); memory through
``prism.graph.traces.memory``; the ET join through ``prism.graph.traces.et``.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from prism.graph.build import op_table as T
from prism.graph.traces.et import read_et_inputs
from prism.graph.traces.kineto import (
    KinetoTrace,
    Marks,
    NormalizeError,
    find_marks,
    read_json_file,
    read_kineto,
    select_units,
    training_spans,
    window_index,
)
from prism.graph.traces.memory import attribute_memory, freed_from
from prism.schemas.annotations import Mark, MarkError, parse_mark
from prism.schemas.comm_log import CommCall, CommLog, HeldTime, trace_offset_ns
from prism.schemas.manifest import CaptureFiles, ManifestError, read_manifest

__all__ = [
    "NormalizeError",
    "baseline_bytes",
    "block_key",
    "block_signatures",
    "et_join_coverage",
    "freed_of_layer",
    "freed_of_rows",
    "memory_addresses",
    "rank_trace",
    "normalize_capture",
    "normalize_rank",
]

ITERATION_END = "prism::iteration_end"
"""The unit from an iteration's last op to its end (every iteration has one, possibly 0 ns)."""

_MARK_FIELDS = (T.STAGE, T.MB, T.LAYER, T.BUCKET, T.PART, T.DIR)
_ABSENT = (-1, -1, -1, -1, "", "")


def normalize_capture(capture_dir: str | os.PathLike) -> dict[int, pd.DataFrame]:
    """Op tables of every captured rank of a complete capture directory."""
    try:
        manifest = read_manifest(capture_dir)
    except ManifestError as e:
        raise NormalizeError(str(e)) from e
    return {r.rank: normalize_rank(capture_dir, r.rank) for r in manifest.ranks}


def normalize_rank(capture_dir: str | os.PathLike, rank: int) -> pd.DataFrame:
    """The op table of ``rank`` (see the module docstring).

    ``df.attrs`` holds 'iterations' (iteration, start_ns, end_ns per profiled iteration),
    'memory_device' and 'et_join_coverage'.
    """
    files = CaptureFiles(Path(capture_dir))
    log = _read_comm_log(files.comm(rank), rank)
    trace = read_kineto(files.kineto(rank))
    marks = find_marks(trace)
    its = marks.iterations
    units = _with_iteration_ends(select_units(training_spans(trace, its)), its)
    win = units["window"].to_numpy()
    start, end = units["start_ns"].to_numpy(), units["end_ns"].to_numpy()
    df = pd.DataFrame(
        {
            T.RANK: rank,
            T.ITERATION: its["iteration"].to_numpy()[win],
            T.SEQ: np.arange(len(units), dtype=np.int64),
            T.NAME: units["name"].to_numpy(),
            T.TID: units["tid"].to_numpy(),
            T.START_NS: start,
            T.DUR_NS: end - start,
            T.GAP_NS: _gaps(start, end, win, its["start_ns"].to_numpy()),
            T.IS_COMM: units["is_comm"].to_numpy(),
        }
    )
    _add_marks(df, np.maximum(start, end - 1), marks)
    _add_comm(df, log, files.comm(rank))
    offset = _trace_offset(df, log)
    _check_calls_marked(df, log, its, offset, rank)
    _waits_on_trace_clock(df, offset)
    _take_out_held(df, log, offset)
    mem = attribute_memory(trace.memory, start, end, its["start_ns"].to_numpy()[win])
    df[T.ALLOC_BYTES], df[T.FREE_BYTES] = mem.alloc_bytes, mem.free_bytes
    df[T.GAP_ALLOC_BYTES], df[T.GAP_FREE_BYTES] = mem.gap_alloc_bytes, mem.gap_free_bytes
    df[T.ALLOC_TOTAL_AT_START] = mem.total_at_start
    df[T.RF_ID] = units["rf_id"].to_numpy()
    _add_et(df, files.et(rank))
    df = df[list(T.COLUMNS)].astype(T.DTYPES)
    df.attrs["iterations"] = its[["iteration", "start_ns", "end_ns"]].to_dict("records")
    df.attrs["memory_device"] = list(mem.device)
    df.attrs["et_join_coverage"] = et_join_coverage(df)
    return df


def freed_of_layer(
    trace: KinetoTrace, rank: int, ops: pd.DataFrame, layer: int, stage: int = -1
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``ops`` (``normalize_rank``'s table of ``rank``, whose trace is ``trace``), the
    bytes it frees of blocks the units of ``layer`` (of ``stage``, where the rank holds several)
    allocated, in its span and in the gap before it: where the program frees what a layer keeps."""
    of = (ops[T.LAYER].to_numpy() == layer) & (ops[T.STAGE].to_numpy() == stage)
    return freed_of_rows(trace, rank, ops, of)


def rank_trace(capture_dir: str | os.PathLike, rank: int) -> KinetoTrace:
    """``rank``'s Kineto trace in the capture at ``capture_dir``."""
    return read_kineto(CaptureFiles(Path(capture_dir)).kineto(rank))


def freed_of_rows(
    trace: KinetoTrace, rank: int, ops: pd.DataFrame, allocated_in: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``ops`` (``normalize_rank``'s table of ``rank``, whose trace is ``trace``), the
    bytes it frees of blocks the rows where ``allocated_in`` is True allocated, in its span and
    in the gap before it (``prism.graph.traces.memory.freed_from``)."""
    its = find_marks(trace).iterations
    units = _with_iteration_ends(select_units(training_spans(trace, its)), its)
    if len(units) != len(ops):
        raise NormalizeError(f"rank {rank}: the trace's units are not those of the op table given")
    window = its["start_ns"].to_numpy()[units["window"].to_numpy()]
    return freed_from(
        trace.memory, units["start_ns"].to_numpy(), units["end_ns"].to_numpy(), window, allocated_in
    )


def memory_addresses(trace: KinetoTrace) -> np.ndarray:
    """The addresses the allocator's events of ``trace`` name (allocated or freed while the
    profiler recorded): a block at none of them was held throughout."""
    memory = trace.memory
    return np.unique(memory["addr"].to_numpy()) if not memory.empty else np.zeros(0, np.int64)


def _read_comm_log(path: Path, rank: int) -> CommLog:
    data = read_json_file(path)
    try:
        log = CommLog.from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise NormalizeError(f"{path}: not a readable comm log ({type(e).__name__}: {e})") from e
    if log.rank != rank:
        raise NormalizeError(f"{path}: comm log of rank {log.rank}, expected rank {rank}")
    return log


def _with_iteration_ends(units: pd.DataFrame, its: pd.DataFrame) -> pd.DataFrame:
    """``units`` with each iteration's end unit after its last one, in program order."""
    if units.empty:
        return units.reset_index(drop=True)
    last = units.groupby("window")["end_ns"].max()
    ends = its["end_ns"].to_numpy()[last.index]
    tails = pd.DataFrame(
        {
            "name": ITERATION_END,
            "tid": its["tid"].to_numpy()[last.index],
            "start_ns": last.to_numpy(),
            "end_ns": np.maximum(ends, last.to_numpy()),
            "rf_id": -1,
            "is_comm": False,
            "window": last.index.to_numpy(),
        }
    )
    both = pd.concat([units, tails.astype({c: units[c].dtype for c in tails.columns})], ignore_index=True)
    return both.sort_values(["window", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)


def _gaps(start: np.ndarray, end: np.ndarray, win: np.ndarray, win_start: np.ndarray) -> np.ndarray:
    if len(start) == 0:
        return start.copy()
    prev_end = np.concatenate(([0], end[:-1]))
    first = np.concatenate(([True], win[1:] != win[:-1]))
    return start - np.where(first, win_start[win], prev_end)


# -- enclosing marks ---------------------------------------------------------------------------
def _add_marks(df: pd.DataFrame, points: np.ndarray, marks: Marks) -> None:
    """Phase and mark fields of the innermost marks holding each point: one sweep in time."""
    edges = sorted(
        [(s, 0, i) for i, (s, _, _) in enumerate(marks.blocks)]
        + [(e, 1, i) for i, (_, e, _) in enumerate(marks.blocks)]
    )
    order = np.argsort(points, kind="stable")
    rows: list[tuple] = [()] * len(points)
    outer = np.full(len(points), -1, dtype=np.int64)
    opened: list[int] = []
    current = ("iter", *_ABSENT)
    k = 0
    for row, p in zip(order.tolist(), points[order].tolist(), strict=True):
        changed = False
        while k < len(edges) and edges[k][0] <= p:  # a mark holds [start, end)
            _, is_end, i = edges[k]
            if is_end:
                opened.remove(i)
            else:
                opened.append(i)
            k += 1
            changed = True
        if changed:
            current = _innermost([marks.blocks[i][2] for i in opened])
        rows[row] = current
        if opened:
            outer[row] = opened[0]
    cols = list(zip(*rows, strict=True)) if rows else [()] * (1 + len(_MARK_FIELDS))
    for name, values in zip((T.PHASE, *_MARK_FIELDS), cols, strict=True):
        df[name] = list(values)
    df[T.OUTER_MARK] = outer  # two passes in a row, one call of a module or run of the engine each


def _innermost(stack: list[Mark]) -> tuple:
    phase = stack[-1].phase.value if stack else "iter"
    values = []
    for field, absent in zip(_MARK_FIELDS, _ABSENT, strict=True):
        value = next((v for m in reversed(stack) if (v := getattr(m, field)) is not None), None)
        values.append(absent if value is None else getattr(value, "value", value))
    return (phase, *values)


# -- comm join ---------------------------------------------------------------------------------
def _add_comm(df: pd.DataFrame, log: CommLog, path: Path) -> None:
    """Comm-log fields of every comm unit; the unit's name becomes the op."""
    names_of_label: dict[str, list[str]] = defaultdict(list)
    for g in log.groups:
        names_of_label[g.label].append(g.name)
    calls = {(c.group, c.gseq): c for c in log.calls}
    position = {g.name: g.ranks.index(log.rank) for g in log.groups if log.rank in g.ranks}
    cols: dict[str, list] = {c: [] for c in _COMM_DEFAULTS}
    comm_rows = np.flatnonzero(df[T.IS_COMM].to_numpy())
    for name in df[T.NAME].to_numpy()[comm_rows]:
        call = _call_of_mark(name, names_of_label, calls, path)
        for col, value in _comm_values(call, position.get(call.group, 0)).items():
            cols[col].append(value)
    for col, default in _COMM_DEFAULTS.items():
        values = np.full(len(df), default, dtype=object)
        values[comm_rows] = cols[col]
        df[col] = values
    df.loc[df[T.IS_COMM], T.NAME] = df.loc[df[T.IS_COMM], T.COMM_OP]


def _trace_offset(df: pd.DataFrame, log: CommLog) -> int | None:
    """The trace's clock minus the comm log's (``trace_offset_ns`` of the calls' marks); None
    without calls."""
    if not df[T.IS_COMM].any():
        return None
    enter = {(c.group, c.gseq): c.enter_ns for c in log.calls}
    comm = df[df[T.IS_COMM]]
    return trace_offset_ns(
        (start, enter[(group, gseq)])
        for start, group, gseq in zip(comm[T.START_NS], comm[T.GROUP_NAME], comm[T.GSEQ], strict=True)
    )


def _check_calls_marked(
    df: pd.DataFrame, log: CommLog, its: pd.DataFrame, offset: int | None, rank: int
) -> None:
    """Every call the program began inside a profiled iteration is a unit of the table: a call
    whose mark the trace lacks would be left out of the graph, silently."""
    if offset is None:
        return
    units = set(zip(df.loc[df[T.IS_COMM], T.GROUP_NAME], df.loc[df[T.IS_COMM], T.GSEQ], strict=True))
    enters = np.array([c.enter_ns for c in log.calls], dtype=np.int64) + offset
    profiled = window_index(enters, its) >= 0
    missing = [
        c for c, inside in zip(log.calls, profiled, strict=True) if inside and (c.group, c.gseq) not in units
    ]
    if missing:
        kinds = ", ".join(
            f"{n} {op} on {label}" for (op, label), n in Counter((c.op, c.label) for c in missing).items()
        )
        raise NormalizeError(
            f"rank {rank}'s trace lacks {len(missing)} of the process-group calls it made in its profiled "
            f"iterations ({kinds}): the profiler recorded no mark for them, and a graph without them would be "
            "wrong; capture again, and report it if it repeats"
        )


def _waits_on_trace_clock(df: pd.DataFrame, offset: int | None) -> None:
    """Where the program waited for each call, on the trace's clock as the units' starts are
    (``program_stage`` places each wait among them)."""
    if offset is not None:
        waited = df[T.FIRST_WAIT_NS].to_numpy() > 0
        df.loc[waited, T.FIRST_WAIT_NS] += offset


def _take_out_held(df: pd.DataFrame, log: CommLog, offset: int | None) -> None:
    """Take the time prism held the program (a paced capture's emulated waits and engine work)
    out of the gaps and durations it fell in: they are to hold the program's own time, and the
    graph charges the waits itself. The waits are on the wall clock (comm log), the units on the
    trace's, ``offset`` (``_trace_offset``) after it."""
    held = HeldTime(log)
    if not held or offset is None:
        return
    start = df[T.START_NS].to_numpy() - offset
    end = start + df[T.DUR_NS].to_numpy()
    until = np.array(
        [[held.until(int(t)) for t in ts] for ts in (start - df[T.GAP_NS].to_numpy(), start, end)]
    )
    df[T.GAP_NS] -= until[1] - until[0]
    df[T.DUR_NS] -= until[2] - until[1]


_COMM_DEFAULTS: dict[str, object] = {
    T.COMM_OP: "",
    T.GROUP_NAME: "",
    T.GROUP_LABEL: "",
    T.GROUP_SIZE: -1,
    T.GSEQ: -1,
    T.BYTES: -1,
    T.DTYPE: "",
    T.PEER: -1,
    T.IS_ASYNC: False,
    T.FIRST_WAIT_NS: 0,
    T.SPLIT_BYTES: "",
    T.BUFFER: 0,
}


def relative_splits(split_bytes: tuple[int, ...], position: int) -> list[int]:
    """A rank's all-to-all splits (bytes to each member, in group order) from its own place: item
    d is what it sends the member d places after it (0: itself), the form every member of the
    group can repeat as its own (each routes as the captured rank does)."""
    p = len(split_bytes)
    return [int(split_bytes[(position + d) % p]) for d in range(p)]


def _comm_values(call: CommCall, position: int) -> dict[str, object]:
    """The op-table fields of ``call``, made by the member at ``position`` of its group."""
    splits = "" if call.split_bytes is None else json.dumps(relative_splits(call.split_bytes, position))
    return {
        T.COMM_OP: call.op,
        T.GROUP_NAME: call.group,
        T.GROUP_LABEL: call.label,
        T.GROUP_SIZE: call.group_size,
        T.GSEQ: call.gseq,
        T.BYTES: call.bytes,
        T.DTYPE: call.dtype,
        T.PEER: -1 if call.peer is None else call.peer,
        T.IS_ASYNC: call.async_op,
        T.FIRST_WAIT_NS: call.first_wait_ns,
        T.SPLIT_BYTES: splits,
        T.BUFFER: call.buffer,
    }


def _call_of_mark(
    name: str, names_of_label: dict[str, list[str]], calls: dict[tuple[str, int], CommCall], path: Path
) -> CommCall:
    try:
        mark = parse_mark(name)
    except MarkError as e:
        raise NormalizeError(f"{path}: malformed comm mark in the trace: {e}") from e
    # A mark names its process group; one of a capture that did not is found by its label.
    groups = [mark.pg] if mark.pg is not None else names_of_label.get(mark.group or "", [])
    found = [c for g in groups if (c := calls.get((g, mark.gseq))) is not None]
    if len(found) > 1:  # several groups share the label: the op and size may still tell them apart
        found = [c for c in found if c.op == mark.op and c.bytes == mark.bytes]
    if not found:
        raise NormalizeError(
            f"{path}: no call for trace mark {name!r} (groups labelled {mark.group!r}: {groups})"
        )
    if len(found) > 1:
        which = [c.group for c in found]
        raise NormalizeError(f"{path}: trace mark {name!r} matches calls of several groups {which}")
    if found[0].op != mark.op:
        raise NormalizeError(f"{path}: trace mark {name!r} joins a {found[0].op} call, not {mark.op}")
    return found[0]


# -- ET join -----------------------------------------------------------------------------------
def _add_et(df: pd.DataFrame, path: Path) -> None:
    compute = ~df[T.IS_COMM].to_numpy()
    rf = df[T.RF_ID].to_numpy()
    found = read_et_inputs(path, rf[compute].tolist())
    shapes = np.full(len(df), "", dtype=object)
    types = np.full(len(df), "", dtype=object)
    for i in np.flatnonzero(compute):
        node = found.get(int(rf[i]))
        if node is not None:
            shapes[i], types[i] = node.shapes, node.types
    df[T.ET_INPUT_SHAPES], df[T.ET_INPUT_TYPES] = shapes, types


def et_join_coverage(df: pd.DataFrame) -> float:
    """Share of compute (non-comm) units that found their ET node; 1.0 when there are none."""
    compute = df[~df[T.IS_COMM] & (df[T.NAME] != ITERATION_END)]
    return 1.0 if compute.empty else float((compute[T.ET_INPUT_TYPES] != "").mean())


# -- readers of the table ----------------------------------------------------------------------
def baseline_bytes(df: pd.DataFrame, iteration: int) -> int:
    """Total Allocated at the start of ``iteration`` (before any of its events)."""
    rows = df[df[T.ITERATION] == iteration]
    if rows.empty:
        raise KeyError(f"iteration {iteration} is not in the op table")
    first = rows.loc[rows[T.SEQ].idxmin()]
    return int(first[T.ALLOC_TOTAL_AT_START] - first[T.GAP_ALLOC_BYTES] + first[T.GAP_FREE_BYTES])


def block_key(df: pd.DataFrame) -> pd.DataFrame:
    """Which block instance each unit belongs to: the columns of ``op_table.BLOCK_KEY``."""
    return df[list(T.BLOCK_KEY)]


def block_signatures(df: pd.DataFrame) -> pd.DataFrame:
    """One row per block instance (``BLOCK_KEY`` columns, in program order) with the tuple of
    its unit names (``names``), their count (``units``) and a stable hash (``signature``).

    Instances of one block kind (same phase/layer-or-part/dir/bucket, any mb or iteration)
    whose names agree can be summarised by medians of their durations. An instance need not
    be contiguous: the units of a microbatch's backward outside its layer marks (before the
    first layer, after the last) form one instance, and so do all units of an iteration
    outside every block mark (phase 'iter').
    """
    key = list(T.BLOCK_KEY)
    ordered = df.sort_values(T.SEQ)
    grouped = ordered.groupby(key, sort=False)[T.NAME]
    out = grouped.agg(tuple).rename("names").reset_index()
    out["units"] = out["names"].map(len)
    out["signature"] = pd.util.hash_array(out["names"].map("\x1f".join).to_numpy(dtype=object))
    return out
