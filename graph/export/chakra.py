"""Chakra execution traces of a graph's ranks, for ASTRA-sim and the other simulators that read
them (``prism-export chakra``), in the schema of the ``mlc-chakra`` package.

One file per rank, ``<prefix>.<rank>.et``: the global metadata first, then the rank's nodes in
program order. Each node's id is its position in the rank's file.

- A compute node is a ``COMP_NODE`` lasting its duration plus the idle gap before it (the
  graph's ``gap_ns``: Python and launch overhead between ops), in µs as Chakra counts them;
  ``is_cpu_op`` is false on every node: each is the rank's own work as ASTRA-sim's NPU runs it.
- A collective is a ``COMM_COLL_NODE`` with ``comm_type``, ``comm_size`` (bytes) and ``pg_name``
  (the layout group, e.g. ``tp.3``, whose ranks ``comm_group.json`` lists as ASTRA-sim's
  communicator-group file does); a send or receive is a ``COMM_SEND_NODE``/``COMM_RECV_NODE``
  with ``comm_src``, ``comm_dst``, ``comm_tag`` (the n-th transfer between the two) and
  ``comm_size``. Their ``duration_micros`` is the graph's comm model's estimate; a gap before
  one becomes a ``COMP_NODE`` named ``prism:gap`` ahead of it.
- ``data_deps``: what the node waits for: the last node before it in program order that blocks
  the program (an asynchronous call does not), and the graph's explicit dependencies (a wait on
  asynchronous calls); ``ctrl_deps``: the node just before it in program order (issue order).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from chakra.schema.protobuf.et_def_pb2 import (
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMP_NODE,
    GlobalMetadata,
    Node,
)
from chakra.schema.protobuf.et_def_pb2 import AttributeProto as Attr
from chakra.src.third_party.utils.protolib import encodeMessage as encode_message

from prism.graph.export.trace import ExportError, graph_layout
from prism.graph.io.parquet import read_rank
from prism.schemas import graph_format as gf
from prism.schemas.annotations import group_label
from prism.schemas.layout import ParallelLayout

COMM_TYPES = {
    "all_reduce": 0, "reduce": 1, "all_gather": 2, "gather": 3, "scatter": 4, "broadcast": 5,
    "all_to_all": 6, "reduce_scatter": 7, "barrier": 9,
}  # fmt: skip
"""Chakra's ``CollectiveCommType`` of each collective a graph has."""

SCHEMA_VERSION = "0.0.4"
_COLUMNS = [gf.STREAM, gf.KIND, gf.NAME, gf.PHASE, gf.DUR_NS, gf.GAP_NS, gf.IS_ASYNC, gf.DEPS, gf.GROUP_KIND,
            gf.GROUP_INDEX, gf.PEER, gf.P2P_SEQ, gf.BYTES, gf.LANE_DEPS]  # fmt: skip


def _us(ns: int) -> int:
    return (int(ns) + 500) // 1000


def rank_nodes(path: str | Path, rank: int) -> list[Node]:
    """The Chakra nodes of ``rank`` of the graph at ``path``, in program order."""
    t = read_rank(path, rank, columns=_COLUMNS).to_pydict()
    if any(t[gf.LANE_DEPS]):
        raise ExportError(
            f"rank {rank} has dependencies across its streams (a GPU rank's graph): the Chakra export "
            "writes graphs of one stream a rank; `prism-export trace` shows this one"
        )
    nodes: list[Node] = []
    id_of: dict[tuple[int, int], int] = {}  # (stream, index within stream) -> node id
    position: dict[int, int] = {}  # per stream: index of the next node
    last: dict[int, int] = {}  # per stream: id of the node just before
    last_blocking: dict[int, int] = {}  # per stream: id of the last node that blocks the program
    for k in range(len(t[gf.KIND])):
        stream, kind = t[gf.STREAM][k], t[gf.KIND][k]
        index = position.get(stream, 0)
        position[stream] = index + 1
        gap = t[gf.GAP_NS][k]
        compute = kind == gf.NodeKind.COMPUTE.value
        if gap > 0 and not compute:  # idle before a call: its own compute node
            _append(
                nodes, last, last_blocking, stream, _node("prism:gap", COMP_NODE, _us(gap)), blocking=True
            )
        node = _node(t[gf.NAME][k], COMP_NODE, _us(t[gf.DUR_NS][k] + (gap if compute else 0)))
        node.attr.append(Attr(name="prism_phase", string_val=t[gf.PHASE][k]))
        if kind == gf.NodeKind.COLLECTIVE.value:
            node.type = COMM_COLL_NODE
            node.attr.extend([
                Attr(name="comm_type", int64_val=COMM_TYPES.get(t[gf.NAME][k], 0)),
                Attr(name="comm_size", int64_val=t[gf.BYTES][k]),
                Attr(name="pg_name", string_val=group_label(t[gf.GROUP_KIND][k], t[gf.GROUP_INDEX][k])),
            ])  # fmt: skip
        elif kind in (gf.NodeKind.SEND.value, gf.NodeKind.RECV.value):
            send = kind == gf.NodeKind.SEND.value
            node.type = COMM_SEND_NODE if send else COMM_RECV_NODE
            peer = t[gf.PEER][k]
            node.attr.extend([
                Attr(name="comm_src", int32_val=rank if send else peer),
                Attr(name="comm_dst", int32_val=peer if send else rank),
                Attr(name="comm_tag", int32_val=t[gf.P2P_SEQ][k]),
                Attr(name="comm_size", int64_val=t[gf.BYTES][k]),
            ])  # fmt: skip
        missing = [d for d in t[gf.DEPS][k] if (stream, d) not in id_of]
        if missing:
            raise ExportError(
                f"rank {rank} stream {stream} index {index}: deps entry {missing[0]} is no earlier node of its "
                "stream; the graph is damaged (prism-validate-graph tells more)"
            )
        explicit = [id_of[(stream, d)] for d in t[gf.DEPS][k]]
        _append(nodes, last, last_blocking, stream, node, blocking=not t[gf.IS_ASYNC][k], deps=explicit)
        id_of[(stream, index)] = node.id
    return nodes


def _node(name: str, node_type: int, duration_us: int) -> Node:
    node = Node(name=name, type=node_type)
    node.duration_micros = duration_us
    # Every node is the rank's own work, as ASTRA-sim's NPU runs it.
    node.attr.append(Attr(name="is_cpu_op", bool_val=False))
    return node


def _append(
    nodes: list[Node], last: dict[int, int], last_blocking: dict[int, int], stream: int, node: Node,
    *, blocking: bool, deps: Iterable[int] = (),
) -> None:  # fmt: skip
    node.id = len(nodes)
    if stream in last:
        node.ctrl_deps.append(last[stream])
    waits = ([last_blocking[stream]] if stream in last_blocking else []) + list(deps)
    node.data_deps.extend(sorted(set(waits)))
    nodes.append(node)
    last[stream] = node.id
    if blocking:
        last_blocking[stream] = node.id


def comm_groups(layout: ParallelLayout, kinds: Iterable[str]) -> dict[str, list[int]]:
    """Every group of each of ``kinds`` by its ``pg_name`` (ASTRA-sim's communicator-group JSON),
    with the world. A one-rank group (an axis of degree 1) is listed like any other."""
    return {"world": list(range(layout.world_size))} | {
        group_label(kind, i): list(ranks)
        for kind in dict.fromkeys(kinds)
        if kind != "world"
        for i, ranks in enumerate(layout.groups(kind))
    }


def _group_kinds(nodes: Iterable[Node]) -> set[str]:
    """The kinds of the groups the collectives among ``nodes`` run on."""
    return {
        a.string_val.partition(".")[0]
        for n in nodes
        if n.type == COMM_COLL_NODE
        for a in n.attr
        if a.name == "pg_name"
    }


def write_chakra(
    path: str | Path, out_dir: Path, ranks: Iterable[int] | None = None, prefix: str = "prism"
) -> list[Path]:
    """Write ``<prefix>.<rank>.et`` for ``ranks`` (default: all) and ``comm_group.json`` into
    ``out_dir``, which appears complete or not at all."""
    chosen = None if ranks is None else sorted(set(ranks))
    layout = graph_layout(path, chosen or ())
    ranks = list(range(layout.world_size)) if chosen is None else chosen
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"{out_dir} exists and is not an empty directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    kinds: set[str] = set()
    try:
        for rank in ranks:
            with open(tmp / f"{prefix}.{rank}.et", "wb") as f:
                metadata = GlobalMetadata(version=SCHEMA_VERSION)
                metadata.attr.extend([
                    Attr(name="schema", string_val=f"{SCHEMA_VERSION}-prism"),
                    Attr(name="prism_rank", int64_val=rank),
                    Attr(name="prism_world_size", int64_val=layout.world_size),
                ])  # fmt: skip
                encode_message(f, metadata)
                nodes = rank_nodes(path, rank)
                kinds |= _group_kinds(nodes)
                for node in nodes:
                    encode_message(f, node)
        # The kinds the written ranks' collectives use, every group of each: a kind of degree 1
        # (a one-rank group) is listed where a call uses it, and no kind that none does.
        (tmp / "comm_group.json").write_text(json.dumps(comm_groups(layout, sorted(kinds)), indent=1))
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out_dir / f"{prefix}.{rank}.et" for rank in ranks]
