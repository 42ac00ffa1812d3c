"""Bind stage programs to target ranks: the rows of graph.parquet for a chunk of ranks.

Every column that depends on the rank (group index, collective id, peer, the duration of a
collective over the rank's group) is computed with numpy over all nodes of all ranks of a
chunk at once; strings are dictionary codes tiled from the stage program.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from prism.graph.build import op_table as ot
from prism.graph.build.compose import (
    GSEQ,
    LAYER,
    MB,
    OVERLAP,
    P2P_DIR,
    P2P_SEQ,
    SKEW,
    StageProgram,
    deps_csr,
)
from prism.graph.build.templates import GROUP_AXIS
from prism.graph.comm.placement import LayoutTables
from prism.peers.comm_model import CommModel
from prism.schemas import graph_format as gf
from prism.schemas.layout import ParallelLayout

# Collective ids: the kind's code in the top bits, then the group index, then the per-group sequence.
AXIS_CODES = {"tp": 1, "dp": 2, "pp": 3, "world": 4}
"""The codes of the kinds every layout has; a layout's other kinds follow in its order (``kind_codes``)."""
_GROUP_SHIFT, _AXIS_SHIFT = 24, 56
SPLITS = "splits"  # an encoded program's relative all-to-all splits: a list per node, else None


def kind_codes(layout: ParallelLayout) -> dict[str, int]:
    """The code of every group kind of ``layout`` in collective ids."""
    codes = dict(AXIS_CODES)
    for kind in layout.bound_kinds():
        codes.setdefault(kind, len(codes) + 1)
    return codes


class BindError(ValueError):
    """A program that cannot be bound to the target layout."""


def axis_size(layout: ParallelLayout, axis: str) -> int:
    """Members of a collective group of kind ``axis``."""
    return layout.world_size if axis == "world" else layout.degree(axis)


def coll_id(axis_code: np.ndarray, group_index: np.ndarray, gseq: np.ndarray) -> np.ndarray:
    """Id shared by every member of one collective instance."""
    return (axis_code.astype(np.int64) << _AXIS_SHIFT) | (group_index.astype(np.int64) << _GROUP_SHIFT) | gseq


@dataclass(frozen=True)
class EncodedProgram:
    """A stage program as arrays, ready to tile over ranks."""

    program: StageProgram
    columns: dict[str, np.ndarray]
    dictionaries: dict[str, pa.Array]
    deps_offsets: np.ndarray
    deps_values: np.ndarray

    @property
    def size(self) -> int:
        return len(self.program.nodes)


_STRING_COLUMNS = {
    gf.KIND: "kind",
    gf.NAME: ot.NAME,
    gf.PHASE: ot.PHASE,
    gf.PART: ot.PART,
    gf.DTYPE: ot.DTYPE,
}


def _node_kind(nodes: pd.DataFrame) -> np.ndarray:
    is_comm = nodes[ot.IS_COMM].to_numpy(dtype=bool)
    op = nodes[ot.COMM_OP].to_numpy(dtype=object)
    kind = np.where(is_comm, gf.NodeKind.COLLECTIVE.value, gf.NodeKind.COMPUTE.value).astype(object)
    kind[is_comm & (op == "send")] = gf.NodeKind.SEND.value
    kind[is_comm & (op == "recv")] = gf.NodeKind.RECV.value
    return kind


def encode_program(program: StageProgram, layout: ParallelLayout) -> EncodedProgram:
    nodes = program.nodes.assign(kind=_node_kind(program.nodes))
    codes = kind_codes(layout)
    unknown = set(nodes.loc[nodes["kind"] == gf.NodeKind.COLLECTIVE.value, GROUP_AXIS]) - set(codes)
    if unknown:
        raise BindError(f"collectives on groups that are not layout groups: {sorted(unknown)}")
    columns, dictionaries = {}, {}
    for column, source in _STRING_COLUMNS.items():
        categorical = pd.Categorical(nodes[source].astype(str))
        columns[column] = categorical.codes.astype(np.int32)
        dictionaries[column] = pa.array(list(categorical.categories), pa.string())
    is_p2p = nodes[P2P_DIR].to_numpy() != 0
    group_kind = np.where(is_p2p, "pp", nodes[GROUP_AXIS].to_numpy(dtype=object))
    categorical = pd.Categorical(group_kind.astype(str))
    columns[gf.GROUP_KIND] = categorical.codes.astype(np.int32)
    dictionaries[gf.GROUP_KIND] = pa.array(list(categorical.categories), pa.string())
    columns["axis_code"] = np.array([codes.get(a, 0) for a in nodes[GROUP_AXIS]], np.int64)
    columns["is_coll"] = nodes["kind"].to_numpy() == gf.NodeKind.COLLECTIVE.value
    for name, source in (
        (gf.MB, MB),
        (gf.LAYER, LAYER),
        (GSEQ, GSEQ),
        (gf.P2P_SEQ, P2P_SEQ),
        (P2P_DIR, P2P_DIR),
    ):
        columns[name] = nodes[source].to_numpy(dtype=np.int64)
    for name in (ot.DUR_NS, ot.GAP_NS, ot.BYTES, ot.ALLOC_BYTES, ot.FREE_BYTES, ot.SEQ, SKEW, OVERLAP):
        columns[name] = nodes[name].to_numpy(dtype=np.int64)
    columns[gf.IS_ASYNC] = nodes[ot.IS_ASYNC].to_numpy(dtype=bool)
    columns["comm_op"] = nodes[ot.COMM_OP].to_numpy(dtype=object).astype(str)
    columns[SPLITS] = np.empty(len(nodes), dtype=object)  # one list per node: no 2-D array
    for i, splits in enumerate(nodes[ot.SPLIT_BYTES]):
        columns[SPLITS][i] = json.loads(splits) if splits else None
    offsets, values = deps_csr(nodes)
    return EncodedProgram(program, columns, dictionaries, offsets, values)


def _tile(values: np.ndarray, times: int) -> np.ndarray:
    return np.tile(values, times)


def _group_columns(e: EncodedProgram, rank: np.ndarray, tables: LayoutTables) -> dict[str, np.ndarray]:
    k = len(rank) // e.size
    axis_code = _tile(e.columns["axis_code"], k)
    is_coll = _tile(e.columns["is_coll"], k)
    p2p_dir = _tile(e.columns[P2P_DIR], k)
    group_index = np.full(len(rank), gf.NONE, np.int32)
    group_size = np.where(p2p_dir != 0, 2, 0).astype(np.int32)
    spanned = np.ones(len(rank), np.int32)
    layout = tables.layout
    for axis, code in kind_codes(layout).items():
        mask = is_coll & (axis_code == code)
        if mask.any():
            group_index[mask] = tables.group_index[axis][rank[mask]]
            group_size[mask] = axis_size(layout, axis)
            spanned[mask] = tables.nodes_spanned[axis][rank[mask]]
    peer = np.where(p2p_dir != 0, rank + p2p_dir * layout.stride("pp"), gf.NONE)
    is_p2p = p2p_dir != 0
    spanned[is_p2p] = 1 + (tables.node_of_rank[rank[is_p2p]] != tables.node_of_rank[peer[is_p2p]])
    gseq = _tile(e.columns[GSEQ], k)
    ids = np.where(is_coll, coll_id(axis_code, np.maximum(group_index, 0), gseq), gf.NONE)
    return {
        gf.GROUP_INDEX: group_index,
        gf.GROUP_SIZE: group_size,
        gf.PEER: peer.astype(np.int32),
        gf.COLL_ID: ids.astype(np.int64),
        "spanned": spanned,
        "is_comm": is_coll | is_p2p,
    }


def _splits(e: EncodedProgram, rank: np.ndarray, tables: LayoutTables) -> tuple[pa.Array, np.ndarray]:
    """The all-to-alls' splits in group order, as the graph's list column (empty for other rows),
    and the (on-node, off-node) bytes that bound them (``LayoutTables.all_to_all_volumes``; NaN
    for rows that are no all-to-all of known splits): each rank of the chunk routes as the
    captured one did, from its own place in its group."""
    k, n = len(rank) // e.size, e.size
    nodes = np.flatnonzero([s is not None for s in e.columns[SPLITS]])
    axes = e.program.nodes[GROUP_AXIS].to_numpy(dtype=object)
    lengths = np.zeros(len(rank), np.int64)
    for i in nodes:
        lengths[i::n] = axis_size(tables.layout, axes[i])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.zeros(offsets[-1], np.int64)
    volumes = np.full((len(rank), 2), np.nan)
    for axis in dict.fromkeys(axes[nodes]):
        of_axis = nodes[axes[nodes] == axis]
        size = axis_size(tables.layout, axis)
        relative = [e.columns[SPLITS][i] for i in of_axis]
        if any(len(splits) != size for splits in relative):
            wrong = next(len(splits) for splits in relative if len(splits) != size)
            raise BindError(
                f"an all_to_all of {wrong} splits on {axis} groups of {size} ranks; "
                "build at the layout the program was captured with"
            )
        relative = np.array(relative, dtype=np.int64).reshape(len(of_axis), size)
        rows = (np.arange(k)[:, None] * n + of_axis[None, :]).ravel()
        relative = np.tile(relative, (k, 1))
        volumes[rows] = tables.all_to_all_volumes(axis, rank[rows], relative)
        values[offsets[rows][:, None] + np.arange(size)] = tables.absolute_splits(axis, rank[rows], relative)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values)), volumes


def _durations(
    e: EncodedProgram, k: int, groups: dict[str, np.ndarray], comm: CommModel, volumes: np.ndarray
) -> np.ndarray:
    dur = _tile(e.columns[ot.DUR_NS], k)
    is_comm = groups["is_comm"]
    if is_comm.any():
        ops = _tile(e.columns["comm_op"], k)[is_comm]
        nbytes = _tile(e.columns[ot.BYTES], k)[is_comm]
        dur = dur.copy()
        overlap = _tile(e.columns[OVERLAP], k)[is_comm]
        dur[is_comm] = comm.durations_ns(
            ops,
            nbytes,
            groups[gf.GROUP_SIZE][is_comm],
            groups["spanned"][is_comm],
            overlap_ns=overlap,
            split_volumes=volumes[is_comm],
        )
    return dur


def _dictionary(e: EncodedProgram, column: str, k: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(_tile(e.columns[column], k)), e.dictionaries[column])


def bind_ranks(e: EncodedProgram, ranks: np.ndarray, tables: LayoutTables, comm: CommModel) -> pa.Table:
    """Rows of ``ranks`` (all of the program's stage, ascending), sorted by (rank, index)."""
    k, n = len(ranks), e.size
    rank = np.repeat(ranks.astype(np.int32), n)
    groups = _group_columns(e, rank, tables)
    split_bytes, volumes = _splits(e, rank, tables)
    deps_offsets = (e.deps_offsets[:-1][None, :] + (np.arange(k) * len(e.deps_values))[:, None]).ravel()
    deps_offsets = np.append(deps_offsets, k * len(e.deps_values)).astype(np.int32)
    columns = {
        gf.RANK: rank,
        gf.STREAM: np.zeros(k * n, np.int16),
        gf.INDEX: _tile(np.arange(n, dtype=np.int32), k),
        gf.KIND: _dictionary(e, gf.KIND, k),
        gf.NAME: _dictionary(e, gf.NAME, k),
        gf.PHASE: _dictionary(e, gf.PHASE, k),
        gf.STAGE: np.full(k * n, e.program.stage, np.int16),
        gf.MB: _tile(e.columns[gf.MB], k).astype(np.int32),
        gf.LAYER: _tile(e.columns[gf.LAYER], k).astype(np.int32),
        gf.PART: _dictionary(e, gf.PART, k),
        gf.DUR_NS: _durations(e, k, groups, comm, volumes),
        gf.GAP_NS: _tile(e.columns[ot.GAP_NS], k),
        gf.SKEW_NS: _tile(e.columns[SKEW], k),
        gf.COLL_ID: groups[gf.COLL_ID],
        gf.GROUP_KIND: _dictionary(e, gf.GROUP_KIND, k),
        gf.GROUP_INDEX: groups[gf.GROUP_INDEX],
        gf.GROUP_SIZE: groups[gf.GROUP_SIZE],
        gf.PEER: groups[gf.PEER],
        gf.P2P_SEQ: _tile(e.columns[gf.P2P_SEQ], k).astype(np.int32),
        gf.BYTES: _tile(e.columns[ot.BYTES], k),
        gf.SPLIT_BYTES: split_bytes,
        gf.DTYPE: _dictionary(e, gf.DTYPE, k),
        gf.IS_ASYNC: _tile(e.columns[gf.IS_ASYNC], k),
        gf.ALLOC_BYTES: _tile(e.columns[ot.ALLOC_BYTES], k),
        gf.FREE_BYTES: _tile(e.columns[ot.FREE_BYTES], k),
        gf.DEPS: pa.ListArray.from_arrays(
            pa.array(deps_offsets), pa.array(_tile(e.deps_values, k), pa.int32())
        ),
        gf.SRC_RANK: np.full(k * n, e.program.src_rank, np.int32),
        gf.SRC_OP: _tile(e.columns[ot.SEQ], k),
    }  # (no lane_deps: one stream a rank)
    return pa.table(columns, schema=pa.schema([f for f in gf.SCHEMA if f.name in columns]))
