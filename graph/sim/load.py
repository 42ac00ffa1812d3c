"""Read a graph file into the engine's arrays (``SimGraph``), checking what the engine relies on.

Row groups are read one at a time into preallocated arrays; collectives and transfers are
indexed into instances (``slot``), same-stream dependencies and dependencies across a rank's
streams (``lane_deps``, with their lags) into one list per node, and each (rank, stream) of a
graph that names its streams becomes an engine lane. The checks here are the cheap ones every
load runs; ``prism-validate-graph`` checks the rest.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from prism.graph.io.lanes import lane_dep_rows
from prism.graph.io.parquet import GraphReader
from prism.graph.sim.engine import COLLECTIVE, COMPUTE, RECV, SEND
from prism.graph.sim.simulate import SimGraph, SimulationError
from prism.schemas import graph_format as gf
from prism.schemas.cluster import wake_points_ns
from prism.schemas.layout import ParallelLayout
from prism.schemas.rank_programs import rank_variants, static_bytes_of_ranks

_KIND_CODES = {
    gf.NodeKind.COMPUTE.value: COMPUTE,
    gf.NodeKind.COLLECTIVE.value: COLLECTIVE,
    gf.NodeKind.SEND.value: SEND,
    gf.NodeKind.RECV.value: RECV,
}
_COLUMNS = [gf.RANK, gf.STAGE, gf.KIND, gf.DUR_NS, gf.GAP_NS, gf.SKEW_NS, gf.IS_ASYNC, gf.COLL_ID, gf.PEER]
_COLUMNS += [gf.P2P_SEQ, gf.GROUP_SIZE]
_COLUMNS += [gf.DEPS, gf.ALLOC_BYTES, gf.FREE_BYTES, gf.STREAM]
_LANE_COLUMNS = [gf.LANE_DEPS]
"""Read only from a graph of several streams a rank (its metadata names them, ``STREAMS_KEY``)."""


def kind_codes(column: pa.ChunkedArray) -> np.ndarray:
    """The engine's node kinds (``COMPUTE``, ``COLLECTIVE``, ...) of a graph's kind column."""
    return _codes(column, _KIND_CODES)


def _codes(column: pa.ChunkedArray, mapping: dict[str, int]) -> np.ndarray:
    column = column.combine_chunks()
    values = column.dictionary.to_pylist()
    unknown = sorted({str(v) for v in values} - set(mapping))
    if unknown:
        raise SimulationError(
            f"unknown node kind(s) {', '.join(map(repr, unknown))} (a graph has {', '.join(mapping)}); "
            "the graph is damaged or was not written by prism-build-graph"
        )
    lookup = np.array([mapping[v] for v in values], np.int8)
    return lookup[column.indices.to_numpy()]


def _slots(
    path: str | Path,
    kind: np.ndarray,
    coll_id: np.ndarray,
    rank: np.ndarray,
    peer: np.ndarray,
    seq: np.ndarray,
    world: int,
):
    """Dense instance id of every collective and transfer node; members per instance."""
    slot = np.full(len(kind), -1, np.int32)
    coll = kind == COLLECTIVE
    uniq, inverse, counts = np.unique(coll_id[coll], return_inverse=True, return_counts=True)
    slot[coll] = inverse
    sizes = [counts]
    p2p = (kind == SEND) | (kind == RECV)
    off_world = np.flatnonzero(p2p & ((peer < 0) | (peer >= world) | (peer == rank) | (seq < 0)))
    if len(off_world):  # the key below would alias another pair's
        raise _unpaired(path, off_world, "a peer outside the world, itself, or no sequence number")
    # A send (a -> b, n) and the recv at b from a with the same n are one transfer.
    src = np.where(kind == SEND, rank, peer)[p2p].astype(np.int64)
    dst = np.where(kind == SEND, peer, rank)[p2p].astype(np.int64)
    key = (src * world + dst) * (int(seq.max()) + 1 if len(seq) else 1) + seq[p2p]
    puniq, pinverse, pcounts = np.unique(key, return_inverse=True, return_counts=True)
    slot[p2p] = len(uniq) + pinverse
    sizes.append(pcounts)
    slot_size = np.concatenate(sizes).astype(np.int64)
    sends = np.bincount(pinverse, weights=kind[p2p] == SEND, minlength=len(puniq))
    unpaired = np.flatnonzero((pcounts != 2) | (sends != 1))
    if len(unpaired):
        rows = np.flatnonzero(p2p)[np.isin(pinverse, unpaired)]
        raise _unpaired(path, rows, "no matching partner")
    return slot, slot_size


def _unpaired(path: str | Path, rows: np.ndarray, why: str) -> SimulationError:
    return SimulationError(
        f"{path}: a send or recv with {why} ({len(rows)} node(s), first global row {rows[0]}); the graph is "
        "damaged (prism-validate-graph tells more)"
    )


class _Columns:
    """The engine's per-node arrays, filled one row group at a time (bounded memory)."""

    INT64 = (gf.DUR_NS, gf.GAP_NS, gf.SKEW_NS, gf.COLL_ID, gf.ALLOC_BYTES, gf.FREE_BYTES)
    INT32 = (gf.RANK, gf.PEER, gf.P2P_SEQ, gf.GROUP_SIZE)

    def __init__(self, n: int, world: int, *, subset: bool = False, lanes: bool = False) -> None:
        self.world = world
        self.lanes = lanes
        self.group_kinds: dict[str, int] = {}  # group_kind string -> code, when reading a subset
        self.arrays = {name: np.empty(n, np.int64) for name in self.INT64}
        self.arrays |= {name: np.empty(n, np.int32) for name in self.INT32}
        self.arrays[gf.STAGE] = np.empty(n, np.int16)
        self.arrays[gf.STREAM] = np.empty(n, np.int16)
        self.arrays[gf.KIND] = np.empty(n, np.int8)
        self.arrays[gf.IS_ASYNC] = np.empty(n, np.bool_)
        if subset:
            self.arrays[gf.GROUP_KIND] = np.empty(n, np.int16)
        self.deps_count = np.zeros(n + 1, np.int64)
        self.deps_chunks: list[np.ndarray] = []
        self.lane_deps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (owner, target, lag) rows
        self.lane_starts: list[np.ndarray] = []  # global first row of each lane
        self.last_rank = -1

    def codes(self, group_kinds: tuple[str, ...]) -> list[int]:
        """Codes of these group kinds in the group_kind array (those seen)."""
        return [self.group_kinds[k] for k in group_kinds if k in self.group_kinds]

    def fill(self, table: pa.Table, offset: int) -> None:
        rows = slice(offset, offset + table.num_rows)
        for name, array in self.arrays.items():
            if name == gf.KIND:
                array[rows] = _codes(table[name], _KIND_CODES)
            elif name == gf.GROUP_KIND:
                column = table[name].combine_chunks()
                lookup = [
                    self.group_kinds.setdefault(v, len(self.group_kinds))
                    for v in column.dictionary.to_pylist()
                ]
                array[rows] = np.asarray(lookup, np.int16)[column.indices.to_numpy()]
            elif name == gf.IS_ASYNC:
                array[rows] = table[name].to_numpy(zero_copy_only=False)
            else:
                array[rows] = table[name].to_numpy()
        rank, stream = self.arrays[gf.RANK][rows], self.arrays[gf.STREAM][rows]
        if not len(rank):
            return
        same_rank = rank[1:] == rank[:-1]
        if (
            rank[0] <= self.last_rank  # a rank's rows in two row groups, or ranks out of order
            or rank[-1] >= self.world
            or (np.diff(rank) < 0).any()
            or (stream < 0).any()
            or (np.diff(stream.astype(np.int32))[same_rank] < 0).any()
            or (not self.lanes and stream.any())  # streams the metadata does not name
        ):
            raise SimulationError(
                f"ranks or streams out of order, ranks outside the world of {self.world}, or streams the metadata "
                f"does not name, in the rows from global row {offset}; the graph is damaged or was not written "
                "by prism-build-graph"
            )
        self.last_rank = int(rank[-1])
        new_lane = np.r_[True, ~same_rank | (stream[1:] != stream[:-1])]
        lane_start = np.flatnonzero(new_lane)
        self.lane_starts.append(offset + lane_start)
        lane_of_row = np.cumsum(new_lane) - 1
        first_of_row = offset + lane_start[lane_of_row]
        deps = table[gf.DEPS].combine_chunks()
        counts = np.diff(deps.offsets.to_numpy())
        self.deps_count[offset + 1 : offset + 1 + table.num_rows] = counts
        if counts.any():  # same-lane indices -> global rows
            owner = np.repeat(np.arange(table.num_rows), counts)
            self.deps_chunks.append(deps.values.to_numpy().astype(np.int64) + first_of_row[owner])
        if self.lanes:
            self._fill_lane_deps(table, offset, rank, stream)

    def _fill_lane_deps(self, table: pa.Table, offset: int, rank: np.ndarray, stream: np.ndarray) -> None:
        """Dependencies on other streams of the same rank, as global rows with their lags."""
        column = table[gf.LANE_DEPS].combine_chunks()
        counts = np.diff(column.offsets.to_numpy())
        if not counts.any():
            return
        values = column.values.flatten()  # stream, index, lag_ns
        first = column.offsets[0].as_py()
        to_stream, index, lag = (v.to_numpy()[first : first + counts.sum()].astype(np.int64) for v in values)
        owner = np.repeat(np.arange(table.num_rows), counts)
        target, named = lane_dep_rows(rank, stream, owner, to_stream, index)
        bad = np.flatnonzero(~named | (lag < 0))
        if len(bad):
            raise SimulationError(
                f"a lane dependency on no node of another stream of the same rank, or with a negative lag "
                f"({len(bad)} of them, first at global row {offset + owner[bad[0]]}); the graph is damaged "
                "(prism-validate-graph tells more)"
            )
        self.lane_deps.append((offset + owner, offset + target, lag))


def load_sim_graph(path: str | Path, ranks: np.ndarray | None = None) -> SimGraph:
    """Read the columns the engine needs and index collectives, transfers and dependencies.

    Row groups are read one at a time into preallocated arrays, so the peak is the engine's
    arrays plus one row group, not the whole Arrow table beside them. ``ranks`` (sorted, whole
    replicas along the layout's fold axis): only those ranks' nodes, read from the row groups that
    hold them; a collective over a group across replicas then has its members among them (``prism.graph.sim.folded``
    reads identical replicas once this way). Each rank's streams are lanes of the engine, in a
    graph whose metadata names its streams (``STREAMS_KEY``; without it every node is on
    stream 0, as the validator checks).
    """
    with GraphReader(path) as reader:
        metadata = reader.metadata
        layout = ParallelLayout.from_dict(metadata.layout)
        world = layout.world_size
        lanes = gf.STREAMS_KEY in metadata.extra
        wanted = [*_COLUMNS, *(_LANE_COLUMNS if lanes else ())]
        if ranks is None:
            chunks, rows, loaded = reader.iter_rank_chunks(wanted), reader.num_rows, np.arange(world)
        else:
            chunks = reader.read_ranks(ranks, [*wanted, gf.GROUP_KIND])
            rows, loaded = sum(t.num_rows for t in chunks), np.asarray(ranks, np.int64)
        columns = _Columns(rows, world, subset=ranks is not None, lanes=lanes)
        offset = 0
        for table in chunks:
            columns.fill(table, offset)
            offset += table.num_rows
            del table
    a = columns.arrays
    rank = a.pop(gf.RANK)
    stream = a.pop(gf.STREAM)
    lane_rank = None
    if stream.any():  # several streams a rank: each one lane of the engine
        lane_first = np.concatenate(columns.lane_starts) if columns.lane_starts else np.zeros(0, np.int64)
        rank_ptr = np.r_[lane_first, rows].astype(np.int64)
        lane_rank = np.searchsorted(loaded, rank[lane_first]).astype(np.int64)
        empty = np.setdiff1d(np.arange(len(loaded)), lane_rank)
    else:
        rank_ptr = np.searchsorted(rank, np.r_[loaded, world]).astype(np.int64)
        empty = np.flatnonzero(np.diff(rank_ptr) == 0)
    if len(empty):  # metadata that claims more ranks than the rows hold: they would simulate as idle
        raise SimulationError(
            f"{path}: rank {loaded[empty[0]]} of the metadata's world of {world} has no node "
            f"({len(empty)} rank(s) without one); the graph is damaged"
        )
    kind = a.pop(gf.KIND)
    slot, slot_size = _slots(path, kind, a.pop(gf.COLL_ID), rank, a.pop(gf.PEER), a.pop(gf.P2P_SEQ), world)
    members = a.pop(gf.GROUP_SIZE)
    if ranks is not None:  # groups across replicas: their members among the replicas read
        spanning = tuple(k for k in dict.fromkeys((*layout.kinds(), "world")) if layout.spans_replicas(k))
        across = np.isin(a.pop(gf.GROUP_KIND), columns.codes(spanning))
        members = np.where(across, members * len(loaded) // world, members)
    _check_membership(path, kind, slot, slot_size, members)
    del rank
    comm_rows = np.flatnonzero(slot >= 0)  # a few % of the rows: sort only those
    slot_nodes = comm_rows[np.argsort(slot[comm_rows], kind="stable")].astype(np.int64)
    slot_nodes_ptr = np.concatenate([[0], np.cumsum(slot_size)]).astype(np.int64)
    deps_ptr = np.cumsum(columns.deps_count)
    deps = np.concatenate(columns.deps_chunks) if columns.deps_chunks else np.zeros(0, np.int64)
    _check_structure(path, a, columns.deps_count[1:], deps, rank_ptr, layout.pp)
    deps_ptr, deps, deps_lag = _with_lane_deps(deps_ptr, deps, columns.lane_deps)
    return SimGraph(
        layout=layout, static_bytes=rank_static_bytes(metadata, layout, loaded), rank_ptr=rank_ptr, stage=a[gf.STAGE], kind=kind, dur=a[gf.DUR_NS], gap=a[gf.GAP_NS],
        skew=_skew_or_none(a[gf.SKEW_NS]), is_async=a[gf.IS_ASYNC], slot=slot, slot_size=slot_size,
        slot_nodes_ptr=slot_nodes_ptr, slot_nodes=slot_nodes, deps_ptr=deps_ptr, deps=deps,
        alloc=a[gf.ALLOC_BYTES], free=a[gf.FREE_BYTES], deps_lag=deps_lag, lane_rank=lane_rank,
        wake_ns=wake_of(metadata.cluster),
    )  # fmt: skip


def wake_of(cluster: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The engine's wake points of a graph's cluster spec (its metadata's dict); None without."""
    table = cluster.get("wake_compute") or {}
    return wake_points_ns(table) if table else None


def _with_lane_deps(
    deps_ptr: np.ndarray, deps: np.ndarray, lane_deps: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Each node's same-lane dependencies (lag 0) followed by its lane dependencies (checked to
    stay inside their rank as they were read), in one CSR."""
    if not lane_deps:
        return deps_ptr, deps, None
    owner, target, lag = (np.concatenate(parts) for parts in zip(*lane_deps, strict=True))
    n = len(deps_ptr) - 1
    same_owner = np.repeat(np.arange(n), np.diff(deps_ptr))
    all_owner = np.r_[same_owner, owner]
    order = np.argsort(all_owner, kind="stable")
    merged = np.r_[deps, target][order]
    merged_lag = np.r_[np.zeros(len(deps), np.int64), lag][order]
    ptr = np.r_[0, np.cumsum(np.bincount(all_owner, minlength=n))].astype(np.int64)
    return ptr, merged.astype(np.int64), merged_lag


def _check_structure(
    path: str | Path,
    a: dict[str, np.ndarray],
    deps_count: np.ndarray,
    deps: np.ndarray,
    rank_ptr: np.ndarray,
    pp: int,
) -> None:
    """The checks that keep the engine from reading past its arrays or adding up garbage, cheap
    enough to run on every load (the full validator, ``prism-validate-graph``, checks the rest)."""

    def bad(what: str, rows: np.ndarray) -> SimulationError:
        return SimulationError(
            f"{path}: {what} ({len(rows)} node(s), first global row {rows[0]}); the graph is damaged or "
            "was not written by prism-build-graph (prism-validate-graph tells more)"
        )

    for column in (gf.DUR_NS, gf.GAP_NS, gf.SKEW_NS, gf.ALLOC_BYTES, gf.FREE_BYTES):
        negative = np.flatnonzero(a[column] < 0)
        if len(negative):
            raise bad(f"negative {column}", negative)
    off_pipeline = np.flatnonzero((a[gf.STAGE] < 0) | (a[gf.STAGE] >= pp))
    if len(off_pipeline):  # a stage indexes the static bytes per stage
        raise bad(f"a stage outside the layout's 0..{pp - 1}", off_pipeline)
    owner = np.repeat(np.arange(len(deps_count)), deps_count)
    rank_of_owner = np.searchsorted(rank_ptr, owner, side="right") - 1
    outside = np.flatnonzero((deps < rank_ptr[rank_of_owner]) | (deps >= owner))
    if len(outside):
        raise bad("a dependency on no earlier node of the same rank and stream", owner[outside])


def _check_membership(
    path: str | Path, kind: np.ndarray, slot: np.ndarray, slot_size: np.ndarray, group_size: np.ndarray
) -> None:
    """Every collective has as many member nodes as its group has ranks (a missing member would
    leave the others to finish it without it)."""
    rows = np.flatnonzero(kind == COLLECTIVE)
    wrong = rows[slot_size[slot[rows]] != group_size[rows]]
    if len(wrong):
        k = int(wrong[0])
        raise SimulationError(
            f"{path}: a collective has {slot_size[slot[k]]} member node(s) where its group has {group_size[k]} "
            f"ranks (first global row {k}); the graph is damaged (prism-validate-graph tells more)"
        )


def _skew_or_none(skew: np.ndarray) -> np.ndarray | None:
    return skew if skew.any() else None  # a quiet capture: no second duration array


def static_bytes_of(metadata: gf.GraphMetadata, layout: ParallelLayout) -> np.ndarray:
    """Static bytes of a rank of each stage, as the build recorded them from the capture
    (``gf.STATIC_BYTES_KEY``); none for a graph built from traces, whose memory is not read."""
    if gf.STATIC_BYTES_KEY in metadata.extra:
        return np.asarray(metadata.extra[gf.STATIC_BYTES_KEY], np.int64)
    if gf.TRACES_KEY in metadata.model:
        return np.zeros(layout.pp, np.int64)
    raise SimulationError(
        "the graph holds no static memory of its stages (a graph of the built-in GPT built by an earlier "
        "prism): rebuild it with prism-build-graph"
    )


def rank_static_bytes(metadata: gf.GraphMetadata, layout: ParallelLayout, ranks) -> np.ndarray:
    """Static bytes of each of ``ranks``: its stage's (``static_bytes_of``), or its variant's."""
    return static_bytes_of_ranks(layout, static_bytes_of(metadata, layout), rank_variants(metadata), ranks)


def graph_column(path: str | Path, column: str, ranks: np.ndarray | None = None) -> np.ndarray:
    """One more column of a graph as numpy (dictionary columns as their strings); ``ranks``
    (sorted): only those ranks' nodes, as ``load_sim_graph(path, ranks)`` reads them."""
    values = _column(path, column, ranks)
    if pa.types.is_dictionary(values.type):
        return np.asarray(values.dictionary.to_pylist(), dtype=object)[values.indices.to_numpy()]
    return values.to_numpy()


def graph_lists(
    path: str | Path, column: str, ranks: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A list column (``graph_column``'s rows) as numpy: each node's offset into the values (one
    more than the nodes), and the values."""
    values = _column(path, column, ranks)
    offsets = values.offsets.to_numpy()
    return offsets - offsets[0], values.flatten().to_numpy()


def split_matrix(
    path: str | Path, offsets: np.ndarray, values: np.ndarray, rows: np.ndarray, size: np.ndarray
) -> np.ndarray:
    """The ``split_bytes`` of ``rows`` (``graph_lists``'s offsets and values; all of one group
    size, ``size`` their group sizes) as one row of bytes a member each, in group order; a list
    whose length is not its group's size is a damaged graph."""
    length = offsets[rows + 1] - offsets[rows]
    if (length != size).any() or len(np.unique(size)) > 1:
        raise SimulationError(
            f"{path}: an all-to-all's {gf.SPLIT_BYTES} disagree with its group size (prism-validate-graph tells more)"
        )
    return values[offsets[rows][:, None] + np.arange(int(size[0]) if len(rows) else 0)]


def _column(path: str | Path, column: str, ranks: np.ndarray | None) -> pa.Array:
    with GraphReader(path) as reader:
        if ranks is None:
            values = reader.read_column(column).combine_chunks()
        else:
            values = pa.chunked_array(
                [t[column] for t in reader.read_ranks(ranks, [column])], gf.SCHEMA.field(column).type
            ).combine_chunks()
    return values
