"""Predict a graph: simulate it (optionally under a what-if) and summarise every rank."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from prism.graph.io.parquet import read_metadata
from prism.graph.sim.fold import fold_replicas
from prism.graph.sim.folded import load_folded
from prism.graph.sim.metrics import breakdown, critical_path
from prism.graph.sim.simulate import SimGraph, SimResult, simulate
from prism.graph.sim.whatif import WhatIf, apply_what_if
from prism.schemas.summary import Summary
from prism.schemas.terminal import Table

_KIND_NAMES = ("compute", "collective", "send", "recv")


def _critical_path_summary(graph: SimGraph, result: SimResult) -> dict:
    """The critical path's length in nodes, the ranks it crosses (of the graph simulated: one
    replica stands for the identical ones) and its time by node kind."""
    path = critical_path(graph, result)
    ranks = graph.rank_of_lane()[np.searchsorted(graph.rank_ptr, path, side="right") - 1]
    span = result.end_ns[path] - result.start_ns[path]
    by_kind = {name: int(span[graph.kind[path] == code].sum()) for code, name in enumerate(_KIND_NAMES)}
    return {"nodes": len(path), "ranks": len(np.unique(ranks)), "ns_by_kind": by_kind}


def predict(
    path: str | Path, what_if: WhatIf | None = None, *, iterations: int = 2, graph: SimGraph | None = None
) -> Summary:
    """Simulate ``path`` and return every rank's predicted iteration time, memory and breakdown.

    Identical dp replicas are read and simulated once (``prism.graph.sim.folded``), those the
    what-if changes alone each on its own; ``graph``: the whole graph already loaded."""
    t0 = time.perf_counter()
    what_if = what_if or WhatIf()
    if graph is not None:  # the whole graph: changed first, then folded by what it has become
        folding = fold_replicas(apply_what_if(graph, path, what_if))
        graph = folding.graph
    else:
        folding = load_folded(path, keep=what_if.ranks, cluster=what_if.cluster)
        graph = apply_what_if(folding.graph, path, what_if, folding.kept_ranks)
    result = simulate(graph, iterations=iterations)
    parts = breakdown(graph, result)
    metadata = read_metadata(path)
    per_rank = folding.per_rank
    ranks = {
        "rank": list(range(len(folding.rank_of))),
        "stage": per_rank(graph.stage[graph.rank_first_row()]).tolist(),
        "iteration_ns": per_rank(result.iteration_ns).tolist(),
        "peak_bytes": per_rank(result.peak_bytes).tolist(),
        "compute_ns": per_rank(parts.compute_ns).tolist(),
        "overhead_ns": per_rank(parts.overhead_ns).tolist(),
        "exposed_comm_ns": per_rank(parts.exposed_comm_ns).tolist(),
        "bubble_ns": per_rank(parts.bubble_ns).tolist(),
    }
    cluster = what_if.cluster.name if what_if.cluster is not None else metadata.cluster.get("name", "")
    return Summary(
        graph=str(path), layout=metadata.layout, cluster=cluster, what_if=what_if.to_dict(),
        iterations_simulated=iterations, engine_s=round(time.perf_counter() - t0, 3), ranks=ranks,
        critical_path=_critical_path_summary(graph, result),
    )  # fmt: skip


def stage_table(summary: Summary, title: str) -> Table:
    """One row per pipeline stage: iteration time spread, where it goes, peak memory."""
    r = {k: np.asarray(v) for k, v in summary.ranks.items()}
    table = Table(title=title)
    for column in (
        "stage",
        "ranks",
        "iter ms (median)",
        "spread ms (max − min)",
        "compute",
        "overhead",
        "exposed comm",
        "bubble",
        "peak MiB (max)",
    ):
        table.add_column(column, justify="right")
    for stage in np.unique(r["stage"]):
        on = r["stage"] == stage
        it = r["iteration_ns"][on] / 1e6

        total = max(1, r["iteration_ns"][on].sum())
        share = {
            name: f"{100 * r[name][on].sum() / total:.1f}%"
            for name in ("compute_ns", "overhead_ns", "exposed_comm_ns", "bubble_ns")
        }
        table.add_row(
            str(stage), str(on.sum()), f"{np.median(it):.2f}", f"{it.max() - it.min():.2f}",
            share["compute_ns"], share["overhead_ns"], share["exposed_comm_ns"], share["bubble_ns"],
            f"{r['peak_bytes'][on].max() / 2**20:.1f}",
        )  # fmt: skip
    path = summary.critical_path
    table.caption = (
        f"job iteration {r['iteration_ns'].max() / 1e6:.2f} ms; critical path {path.get('nodes', 0):,} nodes "
        f"over {path.get('ranks', 0)} ranks; simulated in {summary.engine_s:.1f} s"
    )
    return table
