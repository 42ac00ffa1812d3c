"""A Chrome/Perfetto trace of any rank of a graph, as the simulation runs it (``prism-export trace``).

One complete event ("ph": "X") per node of the rank in the simulation's steady pass, on graph
time (µs from the start of the simulation), with the ``distributedInfo`` a Kineto trace of that
rank carries: HTA loads it beside captured and replayed ranks' traces, Perfetto shows it beside
them. Process id = global rank, thread 1 = the rank's main stream. Compute nodes are ``cpu_op``
events named by their op; collectives and transfers are ``user_annotation`` events named as
prism's marks name them in a capture (``prism:comm`` and the call).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from prism.graph.io.parquet import GraphReader, read_metadata
from prism.graph.sim.folded import load_folded
from prism.graph.sim.simulate import simulate
from prism.schemas import graph_format as gf
from prism.schemas.annotations import group_label
from prism.schemas.layout import ParallelLayout

_COLUMNS = [
    gf.STREAM,
    gf.KIND,
    gf.NAME,
    gf.PHASE,
    gf.MB,
    gf.LAYER,
    gf.GROUP_KIND,
    gf.GROUP_INDEX,
    gf.PEER,
    gf.BYTES,
    gf.DUR_NS,
]


class ExportError(ValueError):
    """An export that cannot be made (a rank the graph does not have); one line for the user."""


def graph_layout(path: str | Path, ranks: Iterable[int]) -> ParallelLayout:
    """The layout of the graph at ``path``, which must have every rank of ``ranks``."""
    return _layout_with(read_metadata(path), ranks)


def _layout_with(metadata: gf.GraphMetadata, ranks: Iterable[int]) -> ParallelLayout:
    layout = ParallelLayout.from_dict(metadata.layout)
    bad = [r for r in ranks if not 0 <= r < layout.world_size]
    if bad:
        raise ExportError(f"rank {bad[0]} is not in the graph (0..{layout.world_size - 1})")
    return layout


def rank_trace(path: str | Path, rank: int, *, iterations: int = 2) -> dict:
    """The trace of ``rank`` of the graph at ``path``: its nodes in the last of ``iterations``
    simulated passes (the steady one), with ``distributedInfo``."""
    with GraphReader(path) as reader:  # one footer for the rank's rows, the layout and the streams
        nodes = reader.read_rank(rank, columns=_COLUMNS).to_pydict()  # (none for a rank not in it)
        layout = _layout_with(reader.metadata, [rank])
        names = reader.metadata.extra.get(gf.STREAMS_KEY) or ["main"]
    folding = load_folded(path)  # identical replicas once: the rank's times are its representative's
    graph, at = folding.graph, int(folding.rank_of[rank])
    result = simulate(graph, iterations=iterations)
    rows = graph.rank_rows(at)
    start, end = result.start_ns[rows], result.end_ns[rows]
    events: list[dict] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": rank,
            "tid": 0,
            "args": {"name": f"rank {rank} (simulated)"},
        },
    ]
    events += [  # one thread row a stream (tid 0 is the process's)
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": s + 1,
         "args": {"name": names[s] if s < len(names) else f"stream {s}"}}
        for s in sorted(set(nodes[gf.STREAM]))
    ]  # fmt: skip
    for k in np.argsort(start, kind="stable"):
        k = int(k)
        compute = nodes[gf.KIND][k] == gf.NodeKind.COMPUTE.value
        events.append(
            {
                "ph": "X",
                "cat": "cpu_op" if compute else "user_annotation",
                "name": nodes[gf.NAME][k] if compute else _comm_name(nodes, k),
                "pid": rank,
                "tid": nodes[gf.STREAM][k] + 1,
                "ts": int(start[k]) / 1e3,
                "dur": max(int(end[k]) - int(start[k]), 0) / 1e3,
                "args": {"node": k, "phase": nodes[gf.PHASE][k], "microbatch": nodes[gf.MB][k],
                         "layer": nodes[gf.LAYER][k], "modelled dur us": nodes[gf.DUR_NS][k] / 1e3},
            }
        )  # fmt: skip
    return {
        "schemaVersion": 1,
        "distributedInfo": layout.distributed_info(rank),
        "traceName": f"prism simulated rank {rank}",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 0,
        "traceEvents": events,
    }


def _comm_name(nodes: dict, k: int) -> str:
    op, nbytes = nodes[gf.NAME][k], nodes[gf.BYTES][k]
    kind = nodes[gf.KIND][k]
    if kind in (gf.NodeKind.SEND.value, gf.NodeKind.RECV.value):
        return f"prism:comm {op} peer {nodes[gf.PEER][k]} ({nbytes} B)"
    return f"prism:comm {op} {group_label(nodes[gf.GROUP_KIND][k], nodes[gf.GROUP_INDEX][k])} ({nbytes} B)"
