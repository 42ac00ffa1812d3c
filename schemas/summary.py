"""``summary.json``: what the simulation predicts for every rank of a graph.

Per-rank values are stored column-wise (one list per field, indexed by rank) so that a
16384-rank summary stays small::

    {"schema": "prism.summary", "version": 1, "graph": "...", "layout": {...}, "cluster": "h100-ib",
     "what_if": {...}, "iterations_simulated": 2, "engine_s": 2.4,
     "ranks": {"rank": [...], "stage": [...], "iteration_ns": [...], "peak_bytes": [...],
               "compute_ns": [...], "overhead_ns": [...], "exposed_comm_ns": [...], "bubble_ns": [...]},
     "critical_path": {"nodes": 5123, "ranks": 32, "ns_by_kind": {"compute": ..., ...}}}
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prism.schemas.files import write_json_atomic

SCHEMA = "prism.summary"
VERSION = 1
RANK_FIELDS = (
    "rank",
    "stage",
    "iteration_ns",
    "peak_bytes",
    "compute_ns",
    "overhead_ns",
    "exposed_comm_ns",
    "bubble_ns",
)


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Predictions for one graph under one what-if."""

    graph: str
    """Path of the graph simulated."""
    layout: dict
    """tp, pp, dp, order."""
    cluster: str
    """Name of the cluster spec the comm durations came from."""
    what_if: dict
    """Changes applied before simulating (empty: the graph as built)."""
    iterations_simulated: int
    """Back-to-back iterations run; the last one is reported."""
    engine_s: float
    """Wall time of loading and simulating."""
    ranks: dict[str, list[int]]
    """RANK_FIELDS -> one value per rank."""
    critical_path: dict = field(default_factory=dict)
    """Length in nodes, ranks crossed, and time by node kind of the chain that ends last."""

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> Summary:
        if data.get("schema") != SCHEMA or data.get("version") != VERSION:
            raise ValueError(
                f"not a prism summary of version {VERSION}: {data.get('schema')!r} v{data.get('version')!r}"
            )
        return cls(**{k: v for k, v in data.items() if k not in ("schema", "version")})


def write_summary(summary: Summary, path: str | os.PathLike) -> None:
    write_json_atomic(path, summary.to_dict(), indent=None)


def read_summary(path: str | os.PathLike) -> Summary:
    return Summary.from_dict(json.loads(Path(path).read_text()))
