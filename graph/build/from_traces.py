"""A graph from Kineto traces recorded by anyone: ``prism-build-graph --from-traces DIR``.

Many users already have ``torch.profiler`` traces of their jobs, one file per rank. Each rank's
trace gives one iteration, a ``ProfilerStep`` of it (the last one every trace holds, or the one
asked for; or, for traces recorded without a schedule, the trace's whole window), as lanes of
the graph (``prism.graph.build.gpu_lanes``):

- the step's CUDA runtime calls on every CPU thread (stream 0 the thread that marked the step,
  then the others), the CPU work between them kept as recorded gaps, and after the last call
  of the marking thread the rest of the step;
- the GPU work those calls launched, on its stream (``cuda stream N``), after its launch by the
  rank's fitted launch latency, in order on the stream, after the work it waits for;
- a synchronizing call waits for the GPU work it synchronizes with;
- each NCCL kernel of a ``record_param_comms`` collective is a collective node: the n-th one of
  a group in the step is one instance on every member, which starts when every member's kernel
  has arrived and lasts as long as the kernel took in the trace (its recorded duration: the
  graph reproduces the trace before any what-if changes it).

The layout is the one the collectives' groups fit (``prism.graph.build.trace_groups``): data
parallel over ``distributedInfo.world_size`` ranks when they all span the world, else tensor
and data parallel. A rank without a trace takes the rows of the nearest traced rank below it
(or the first one), each of its collectives on its own group of that kind: in a job without
pipeline stages every rank has the same role. Memory is not read (zero).
"""

from __future__ import annotations

import ast
import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from prism.graph.build.gpu_lanes import lane_graph
from prism.graph.build.trace_groups import (
    KINDS,
    CollectiveIds,
    GroupError,
    group_kind,
    infer_layout,
    number_in_groups,
)
from prism.graph.io.parquet import GraphWriter
from prism.graph.traces.gpu import GPU_KINDS, EdgeKind, EventKind, GpuTrace, dependencies, read_gpu_trace
from prism.graph.traces.gpu_timeline import LaunchModel, on_lanes, trace_lanes
from prism.peers.comm_model import OPS
from prism.schemas import PRISM_VERSION
from prism.schemas import graph_format as gf
from prism.schemas.layout import ParallelLayout

TRACE_SUFFIXES = (".json", ".json.gz")
MAIN = "main thread"
_ITEMSIZE = {
    "Float": 4,
    "Half": 2,
    "BFloat16": 2,
    "Double": 8,
    "Int": 4,
    "Long": 8,
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
}
_STRING_COLUMNS = [f.name for f in gf.SCHEMA if pa.types.is_dictionary(f.type)]


class TraceGraphError(ValueError):
    """Traces a graph cannot be built from; the message is one line for the user."""


@dataclass(frozen=True)
class TracedRank:
    """One rank's step as rows of the graph, before streams are numbered across ranks."""

    rank: int
    path: Path
    step: int
    recorded_ns: int
    """The step's span as the trace recorded it."""
    model: LaunchModel
    lanes: list[str]
    """Each lane's stream name, in the order of ``rows``' ``lane`` column."""
    rows: pd.DataFrame
    """One row per node: lane, index, kind, name, dur_ns, gap_ns, coll (-1 or the collective's n
    within the step), members (a collective's group, sorted; () elsewhere), bytes, lane_deps
    ((lane, index, lag) each)."""


def trace_files(directory: Path) -> list[Path]:
    """The Kineto trace files of ``directory`` (not its subdirectories), sorted by name."""
    if not directory.is_dir():
        raise TraceGraphError(f"{directory}: not a directory")
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise TraceGraphError(f"{directory}: no trace files (*.json, *.json.gz)")
    return files


def read_ranks(files: list[Path]) -> tuple[dict[int, GpuTrace], int]:
    """Each trace by its rank (``distributedInfo``; a lone trace without a world size is rank 0
    of 1), and the world size."""
    traces = [read_gpu_trace(f) for f in files]
    if len(traces) == 1 and (traces[0].rank is None or traces[0].world_size is None):
        return {0: traces[0]}, 1
    worlds = {t.world_size for t in traces}
    missing = [t.path.name for t in traces if t.rank is None or t.world_size is None]
    if missing:
        raise TraceGraphError(
            f"{missing[0]}: no distributedInfo rank and world_size (several traces need them)"
        )
    if len(worlds) != 1:
        raise TraceGraphError(f"the traces disagree on the world size: {sorted(worlds)}")
    world = worlds.pop()
    by_rank: dict[int, GpuTrace] = {}
    for t in traces:
        if not 0 <= t.rank < world:
            raise TraceGraphError(f"{t.path.name}: rank {t.rank} outside the world of {world}")
        if t.rank in by_rank:
            raise TraceGraphError(f"{t.path.name} and {by_rank[t.rank].path.name} are both rank {t.rank}")
        by_rank[t.rank] = t
    return dict(sorted(by_rank.items())), world


def launches_gpu_work(trace: GpuTrace, step: int) -> bool:
    """Whether ``step``'s span launched GPU work: the step a profiler opens as it stops (a stub of
    no work, the trace's last) is not one of the job's."""
    span = trace.steps[trace.steps["step"] == step].iloc[0]
    ev = trace.events
    on_gpu = ev["kind"].isin([k.value for k in GPU_KINDS]).to_numpy()
    within = ev["start_ns"].between(span["start_ns"], span["end_ns"], inclusive="left").to_numpy()
    calls = ev.loc[~on_gpu & within & (ev["correlation"] >= 0).to_numpy(), "correlation"]
    return bool(calls.isin(ev.loc[on_gpu, "correlation"]).any())


WHOLE_TRACE = -1
"""The step number of a trace's whole window (``as_one_step``)."""


def as_one_step(trace: GpuTrace) -> GpuTrace:
    """``trace`` with its whole window as its one step (``WHOLE_TRACE``), from its first CPU event
    to the end of its last event, marked by the thread that made the most runtime calls: a trace
    recorded without ``torch.profiler``'s schedule has no ProfilerStep."""
    ev = trace.events
    calls = ev[ev["kind"] == EventKind.RUNTIME.value]
    if calls.empty:
        raise TraceGraphError(f"{trace.path.name}: no CUDA runtime call launched its GPU work")
    steps = pd.DataFrame({
        "step": [WHOLE_TRACE], "tid": [int(calls["tid"].value_counts().idxmax())],
        "start_ns": [int(ev.loc[ev["tid"] >= 0, "start_ns"].min())], "end_ns": [int(ev["end_ns"].max())],
    })  # fmt: skip
    return dataclasses.replace(trace, steps=steps)


def common_step(traces: dict[int, GpuTrace], step: int | None) -> int:
    """The step to build: ``step``, or the last one every trace holds that launched GPU work
    on every trace."""
    held = [set(t.steps["step"].tolist()) for t in traces.values()]
    common = set.intersection(*held) if held else set()
    if step is not None:
        lacking = [t.path.name for t in traces.values() if step not in set(t.steps["step"].tolist())]
        if lacking:
            raise TraceGraphError(f"{lacking[0]} has no ProfilerStep#{step}")
        return step
    if not common:
        raise TraceGraphError(
            "the traces have no ProfilerStep in common (record them with torch.profiler's schedule, "
            "or build each trace's whole window with --whole-trace)"
        )
    working = [n for n in sorted(common) if all(launches_gpu_work(t, n) for t in traces.values())]
    if not working:
        raise TraceGraphError(
            f"no ProfilerStep the traces hold in common ({', '.join(map(str, sorted(common)))}) launched GPU "
            "work on every trace: name one with --step"
        )
    return working[-1]


def traced_rank(
    rank: int, trace: GpuTrace, step_no: int, world: int, delays: LaunchModel | None = None
) -> TracedRank:
    """The rows of ``trace``'s step ``step_no``; ``delays``: the launch and stream delays to
    place its GPU work by (default: fitted on ``trace``)."""
    step = trace.steps[trace.steps["step"] == step_no].iloc[0]
    begin, finish = int(step["start_ns"]), int(step["end_ns"])
    edges = dependencies(trace)
    model = LaunchModel.fit(trace, edges) if delays is None else delays
    sub, sub_edges, new_row = _step_events(trace, edges, begin, finish)
    lanes = lane_graph(sub, sub_edges, model)
    g = lanes.graph
    sub_ev = sub.events
    sub_gpu, sub_cpu = on_lanes(sub_ev)
    lane_rows = trace_lanes(sub_ev, sub_gpu, sub_cpu)
    names = _lane_names(sub_ev, [rows[0] for rows in lane_rows], int(step["tid"]))
    node_event = np.full(len(g.dur), -1, np.int64)  # the event each node stands for
    for e in range(len(sub_ev)):
        if lanes.first_node[e] >= 0:
            node_event[lanes.first_node[e] : lanes.last_node[e] + 1] = e
    coll, nbytes, coll_name, members = _collectives(
        trace, edges, new_row, lanes.first_node, len(g.dur), world
    )
    node_lane = np.repeat(np.arange(g.lanes), np.diff(g.rank_ptr))
    index = np.arange(len(g.dur)) - g.rank_ptr[node_lane]
    gap = g.gap.copy()
    for lane, rows in enumerate(lane_rows):  # each CPU lane starts with the step, as recorded
        if not sub_gpu[rows[0]]:
            gap[g.rank_ptr[lane]] = int(sub_ev.at[rows[0], "start_ns"]) - begin
    lane_deps = [
        [
            (int(node_lane[d]), int(index[d]), int(lag))
            for d, lag in zip(g.deps[a:b], g.deps_lag[a:b], strict=True)
        ]
        for a, b in zip(g.deps_ptr[:-1], g.deps_ptr[1:], strict=True)
    ]
    names_of = sub_ev["name"].to_numpy()
    rows = pd.DataFrame({
        "lane": node_lane, "index": index, "kind": np.where(coll >= 0, gf.NodeKind.COLLECTIVE.value, gf.NodeKind.COMPUTE.value),
        "name": np.where(coll >= 0, coll_name, names_of[node_event]), "dur_ns": g.dur, "gap_ns": gap,
        "coll": coll, "members": members, "bytes": nbytes, "lane_deps": lane_deps,
    })  # fmt: skip
    rows = _with_step_end(rows, names, begin, finish, sub_ev, lane_rows)
    return TracedRank(
        rank=rank,
        path=trace.path,
        step=step_no,
        recorded_ns=finish - begin,
        model=model,
        lanes=names,
        rows=rows,
    )


def _step_events(
    trace: GpuTrace, edges: pd.DataFrame, begin: int, finish: int
) -> tuple[GpuTrace, pd.DataFrame, np.ndarray]:
    """The step's part of the trace: the runtime calls that began in [begin, finish) on any
    thread and the GPU work they launched; the edges among them; each event's new row (-1: out)."""
    ev = trace.events
    _, on_cpu = on_lanes(ev)
    start = ev["start_ns"].to_numpy()
    calls = on_cpu & (start >= begin) & (start < finish)
    launch = edges[edges["kind"] == EdgeKind.LAUNCH.value]
    keep = calls.copy()
    keep[launch["dst"].to_numpy()[calls[launch["src"].to_numpy()]]] = True
    kept = np.flatnonzero(keep)
    new_row = np.full(len(ev), -1, np.int64)
    new_row[kept] = np.arange(len(kept))
    inside = (new_row[edges["src"].to_numpy()] >= 0) & (new_row[edges["dst"].to_numpy()] >= 0)
    sub_edges = edges[inside].assign(src=lambda e: new_row[e["src"]], dst=lambda e: new_row[e["dst"]])
    return dataclasses.replace(trace, events=ev.iloc[kept].reset_index(drop=True)), sub_edges, new_row


def _lane_names(ev: pd.DataFrame, firsts: list[int], step_tid: int) -> list[str]:
    """Each lane's stream name: the thread that marked the step, the rank's other threads by
    thread id ("thread 2", ...: ids differ between ranks), its GPU streams by number (and device,
    where the rank ran work on more than one)."""
    tids = sorted({int(ev.at[r, "tid"]) for r in firsts if ev.at[r, "stream"] < 0} - {step_tid})
    devices = {int(ev.at[r, "device"]) for r in firsts if ev.at[r, "stream"] >= 0}
    names = []
    for r in firsts:
        if ev.at[r, "stream"] >= 0:
            device = f" {int(ev.at[r, 'device'])}" if len(devices) > 1 else ""
            names.append(f"cuda{device} stream {int(ev.at[r, 'stream'])}")
        elif int(ev.at[r, "tid"]) == step_tid:
            names.append(MAIN)
        else:
            names.append(f"thread {tids.index(int(ev.at[r, 'tid'])) + 2}")
    return names


def _with_step_end(
    rows: pd.DataFrame,
    names: list[str],
    begin: int,
    finish: int,
    ev: pd.DataFrame,
    lane_rows: list[np.ndarray],
) -> pd.DataFrame:
    """The marking thread's CPU work after its last call, to the step's end: a node of no
    duration after that gap (the thread gets a lane of its own if it made no call)."""
    if MAIN in names:
        lane = names.index(MAIN)
        last_event = lane_rows[lane][-1]
        after = finish - int(ev.at[last_event, "end_ns"])
        index = int(rows.loc[rows["lane"] == lane, "index"].max()) + 1
    else:
        lane, after, index = len(names), finish - begin, 0
        names.append(MAIN)
    end = {"lane": lane, "index": index, "kind": gf.NodeKind.COMPUTE.value, "name": "ProfilerStep end",
           "dur_ns": 0, "gap_ns": max(after, 0), "coll": -1, "members": (), "bytes": 0, "lane_deps": []}  # fmt: skip
    return pd.concat([rows, pd.DataFrame([end])], ignore_index=True)


def _collectives(
    trace: GpuTrace, edges: pd.DataFrame, new_row: np.ndarray, first_node: np.ndarray, nodes: int, world: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per node: its collective's n within the step (-1: not an NCCL kernel), bytes, op name, and
    the collective's group (sorted ranks; () elsewhere)."""
    coll = np.full(nodes, -1, np.int64)
    nbytes = np.zeros(nodes, np.int64)
    names = np.full(nodes, "", dtype=object)
    groups = np.empty(nodes, dtype=object)
    groups[:] = [()] * nodes
    comm = edges[edges["kind"] == EdgeKind.COMM.value]
    by_op = trace.collectives.set_index("event")
    found = []
    for op, kernel in zip(comm["src"].to_numpy(), comm["dst"].to_numpy(), strict=True):
        if new_row[kernel] < 0:
            continue
        c = by_op.loc[op]
        members = _group_ranks(c["group_ranks"], int(c["group_size"]), world)
        if not all(0 <= r < world for r in members):
            raise TraceGraphError(
                f"{trace.path.name}: a {c['collective']} over ranks {members}, outside the world of {world}"
            )
        node = int(first_node[new_row[kernel]])
        groups[node] = tuple(members)
        found.append((int(trace.events.at[kernel, "start_ns"]), node))
        nbytes[node] = max(int(c["in_nelems"]), 0) * _ITEMSIZE.get(str(c["dtype"]), 0)
        names[node] = _op_name(str(c["collective"])) or _op_of_kernel(str(trace.events.at[kernel, "name"]))
    for n, (_, node) in enumerate(sorted(found)):  # the step's n-th, in the order the GPU ran them
        coll[node] = n
    return coll, nbytes, names, groups


def _group_ranks(text: object, size: int, world: int) -> list[int]:
    """``Process Group Ranks`` as recorded ("[0, 1]"); all of 0..size-1 where only the size is,
    and the world where neither is (traces of older PyTorch record no arguments)."""
    try:
        ranks = ast.literal_eval(str(text))
        if isinstance(ranks, list | tuple) and all(isinstance(r, int) for r in ranks) and ranks:
            return sorted(ranks)
    except (ValueError, SyntaxError):
        pass
    return list(range(size if size > 0 else world))


def _op_name(recorded: str) -> str:
    """prism's name of a recorded collective ("allreduce", "_allgather_base",
    "reduce_scatter_tensor" -> all_reduce, all_gather, reduce_scatter); "" if none fits."""
    squashed = "".join(ch for ch in recorded.lower() if ch.isalpha())
    # (OPS lists reduce_scatter before reduce and all_gather before gather: the longer name wins)
    return next((op for op in OPS if squashed.startswith(op.replace("_", ""))), "")


_KERNEL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
               "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send_recv", "AllToAll": "all_to_all"}  # fmt: skip


def _op_of_kernel(kernel: str) -> str:
    """The collective an NCCL kernel runs, from its name (``ncclKernel_AllReduce_RING_LL_Sum_float``)."""
    for word, op in _KERNEL_OPS.items():
        if f"_{word}_" in f"{kernel}_" or f"nccl{word}" in kernel:
            return op
    return "collective"


def stream_names(ranks: list[TracedRank]) -> list[str]:
    """Every stream name of the traces, numbered alike on every rank: the main thread, the other
    CPU threads, then the GPU streams."""

    def order(name: str) -> tuple[int, int, str]:
        if name == MAIN:
            return (0, 0, name)
        kind, _, number = name.rpartition(" ")
        return (1 if kind == "thread" else 2, int(number), name)

    return sorted({n for r in ranks for n in r.lanes}, key=order)


def rank_table(traced: TracedRank, streams: list[str], ids: CollectiveIds) -> pa.Table:
    """The graph rows of ``traced``'s rank (``RankCopies`` copies them for a rank without a trace)."""
    rows = traced.rows
    number = np.array([streams.index(n) for n in traced.lanes], np.int16)
    stream = number[rows["lane"].to_numpy()]
    order = np.lexsort((rows["index"].to_numpy(), stream))
    coll = rows["coll"].to_numpy()
    kinds = np.array(
        [group_kind(ids.layout, m) if c >= 0 else "" for c, m in zip(coll, rows["members"], strict=True)]
    )
    group_index = ids.group_index(traced.rank, kinds)
    n = len(rows)
    columns = {
        gf.RANK: np.full(n, traced.rank, np.int32), gf.STREAM: stream, gf.INDEX: rows["index"].to_numpy(np.int32),
        gf.KIND: rows["kind"].to_numpy(), gf.NAME: rows["name"].astype(str).to_numpy(), gf.PHASE: np.full(n, ""),
        gf.STAGE: np.zeros(n, np.int16), gf.MB: np.full(n, -1, np.int32), gf.LAYER: np.full(n, -1, np.int32),
        gf.PART: np.full(n, ""), gf.DUR_NS: rows["dur_ns"].to_numpy(np.int64), gf.GAP_NS: rows["gap_ns"].to_numpy(np.int64),
        gf.SKEW_NS: np.zeros(n, np.int64), gf.COLL_ID: ids.coll_id(kinds, group_index, number_in_groups(kinds, coll)),
        gf.GROUP_KIND: kinds, gf.GROUP_INDEX: group_index,
        gf.GROUP_SIZE: ids.group_size(kinds), gf.PEER: np.full(n, -1, np.int32),
        gf.P2P_SEQ: np.full(n, -1, np.int32), gf.BYTES: rows["bytes"].to_numpy(np.int64), gf.DTYPE: np.full(n, ""),
        gf.IS_ASYNC: np.zeros(n, np.bool_), gf.ALLOC_BYTES: np.zeros(n, np.int64), gf.FREE_BYTES: np.zeros(n, np.int64),
        gf.DEPS: [[] for _ in range(n)], gf.SRC_RANK: np.full(n, traced.rank, np.int32), gf.SRC_OP: np.arange(n),
        gf.SPLIT_BYTES: [[] for _ in range(n)],
        gf.LANE_DEPS: [
            [{gf.LANE_DEP_STREAM: int(number[lane]), gf.LANE_DEP_INDEX: i, gf.LANE_DEP_LAG_NS: lag} for lane, i, lag in deps]
            for deps in rows["lane_deps"]
        ],
    }  # fmt: skip
    schema = pa.schema([f.with_type(pa.string()) if f.name in _STRING_COLUMNS else f for f in gf.SCHEMA])
    return pa.table(columns, schema=schema).take(pa.array(order)).cast(gf.SCHEMA)


class RankCopies:
    """A traced rank's graph rows, and the same rows as those of a rank without a trace: its
    collectives on that rank's own groups of their kinds, the n-th of each group as in the rows."""

    def __init__(self, table: pa.Table, ids: CollectiveIds) -> None:
        self.table, self._ids = table, ids
        kinds = np.asarray(table.column(gf.GROUP_KIND).to_pylist(), dtype=object)
        self._of_kind = {k: np.flatnonzero(kinds == k) for k in KINDS if (kinds == k).any()}
        self._span_n = ids.n_of(table.column(gf.COLL_ID).to_numpy()) * ids.span

    def as_rank(self, rank: int) -> pa.Table:
        n = self.table.num_rows
        index, coll_id = np.full(n, -1, np.int32), np.full(n, -1, np.int64)
        for kind, rows in self._of_kind.items():
            index[rows] = self._ids.index_of(rank, kind)
            coll_id[rows] = self._span_n[rows] + self._ids.key(kind, int(index[rows[0]]))
        table = self.table
        for name, values in (
            (gf.RANK, np.full(n, rank, np.int32)),
            (gf.GROUP_INDEX, index),
            (gf.COLL_ID, coll_id),
        ):
            at = table.schema.get_field_index(name)
            table = table.set_column(at, gf.SCHEMA.field(name), pa.array(values, gf.SCHEMA.field(name).type))
        return table


@dataclass(frozen=True)
class TraceBuild:
    """What ``build_from_traces`` made."""

    layout: ParallelLayout
    step: int
    traced: dict[int, TracedRank]
    filled_from: dict[int, int]
    """Each rank without a trace and the traced rank whose rows it took."""
    streams: list[str]


def build_from_traces(
    directory: Path,
    out: Path,
    *,
    step: int | None = None,
    whole: bool = False,
    delays: LaunchModel | None = None,
    on_rank: Callable[[int, int], None] | None = None,
) -> TraceBuild:
    """Write the graph of the traces in ``directory`` to ``out`` (see the module's docstring).
    ``whole``: each trace's whole window is its step (``as_one_step``; not with ``step``).
    ``delays``: every rank's launch and stream delays (default: each fitted on its own trace)."""
    if whole and step is not None:
        raise TraceGraphError("a step, or the whole trace: not both")
    by_rank, world = read_ranks(trace_files(directory))
    if whole:
        by_rank = {rank: as_one_step(trace) for rank, trace in by_rank.items()}
    step_no = common_step(by_rank, step)
    traced = {r: traced_rank(r, t, step_no, world, delays) for r, t in by_rank.items()}
    try:
        layout = infer_layout({m for t in traced.values() for m in t.rows["members"] if m}, world)
    except GroupError as e:
        raise TraceGraphError(str(e)) from None
    ids = CollectiveIds(layout)
    _check_collectives_match(traced, layout)
    streams = stream_names(list(traced.values()))
    present = sorted(traced)
    filled_from = {
        r: max((p for p in present if p <= r), default=present[0]) for r in range(world) if r not in traced
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = gf.GraphMetadata(
        layout=layout.to_dict(),
        model={gf.TRACES_KEY: {"directory": str(directory), "step": step_no,
                               "files": {str(r): t.path.name for r, t in traced.items()}}},
        cluster={}, capture_digest="", build_options={"from_traces": str(directory), "step": step_no},
        prism_version=PRISM_VERSION,
        extra={
            gf.STREAMS_KEY: streams,
            gf.RECORDED_STEP_KEY: {str(r): t.recorded_ns for r, t in traced.items()},
            "filled_from": {str(r): p for r, p in filled_from.items()},
            "launch_model": {str(r): dataclasses.asdict(t.model) for r, t in traced.items()},
            "launch_model_fitted": delays is None,
        },
    )  # fmt: skip
    with GraphWriter(out, metadata) as writer:
        source: RankCopies | None = None  # the rows of the last traced rank, which the next ranks may copy
        for rank in range(world):
            if rank in traced or source is None:
                source = RankCopies(rank_table(traced[filled_from.get(rank, rank)], streams, ids), ids)
            writer.write_ranks(source.table if rank in traced else source.as_rank(rank))
            if on_rank is not None:
                on_rank(rank + 1, world)
    return TraceBuild(layout=layout, step=step_no, traced=traced, filled_from=filled_from, streams=streams)


def _check_collectives_match(traced: dict[int, TracedRank], layout: ParallelLayout) -> None:
    """Every traced rank ran as many collectives of each group kind in the step (the n-th of a
    group is one instance)."""

    def counts(t: TracedRank) -> str:
        kinds = Counter(group_kind(layout, m) for m in t.rows["members"] if m)
        return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "none"

    seen = {r: counts(t) for r, t in traced.items()}
    if len(set(seen.values())) > 1:
        listed = "; ".join(f"rank {r}: {c}" for r, c in seen.items())
        raise TraceGraphError(f"the traced ranks ran different collectives in the step ({listed})")
