"""A layout's rank maths over arrays of ranks (``ParallelLayout``'s, vectorised with numpy): what
the build, the validator and the simulator need for every rank of a world at once."""

from __future__ import annotations

import numpy as np

from prism.schemas.group_kinds import DENSE_AXES, WORLD
from prism.schemas.layout import ParallelLayout


def fine_coords(layout: ParallelLayout, ranks: np.ndarray) -> dict[str, np.ndarray]:
    """Every rank's index on every axis of both systems (``ParallelLayout.fine_coords``)."""
    ranks = np.asarray(ranks, np.int64)
    out = {a: (ranks // layout.stride(a)) % layout.degree(a) for a in DENSE_AXES}
    region, scale = np.zeros_like(ranks), 1
    for axis in layout.region_axes:
        region += out[axis] * scale
        scale *= layout.degree(axis)
    out["etp"] = region % layout.etp
    out["ep"] = region // layout.etp % layout.ep
    out["edp"] = region // (layout.etp * layout.ep)
    return out


def group_indices(layout: ParallelLayout, kind: str, fine: dict[str, np.ndarray]) -> np.ndarray:
    """Each rank's group index along ``kind`` (``ParallelLayout.group_index``), from ``fine_coords``."""
    if kind == WORLD:
        return np.zeros_like(fine["tp"])
    index, scale = np.zeros_like(fine["tp"]), 1
    for other in layout.others(kind):
        index += fine[other] * scale
        scale *= layout.degree(other)
    return index
