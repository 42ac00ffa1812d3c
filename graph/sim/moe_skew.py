"""The routing-imbalance what-if (``prism-simulate --moe-skew S``): experts that get more tokens
than others, which a small run's router cannot show.

Every rank routes its tokens over the members of its all-to-all group by a Zipf law of exponent
``S`` over their group rank: member ``j`` gets the share ``w_j = (j+1)^-S / Σ_k (k+1)^-S`` of
what each rank sends (0: an even share each; the first member of every group is the busiest).
Each rank sends as many bytes as in the graph, so member ``j`` receives ``p·w_j`` times an even
share.

Which all-to-alls carry tokens: a dispatch and the combine that brings the experts' results
back carry the same bytes on the same group, one right after the other among that group's
all-to-alls (in the forward pass, and again as their gradients in the backward). Each such pair
is re-priced with its traffic skewed (``LayoutTables.skewed_volumes``), as a factor on its
price in the graph, so the build's terms for the call's timing are kept; the compute between the
two, the experts' work, takes ``p·w_j`` times as long on member ``j``. Other all-to-alls (the
per-expert token counts exchanged before a dispatch) keep their size and price.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from prism.graph.comm.placement import LayoutTables
from prism.graph.sim.engine import COLLECTIVE, COMPUTE
from prism.graph.sim.load import graph_column, graph_lists, split_matrix
from prism.graph.sim.simulate import SimGraph
from prism.peers.comm_model import CommModel
from prism.schemas import graph_format as gf
from prism.schemas.cluster import ClusterSpec


class MoeSkewError(ValueError):
    """A skew that cannot be applied to this graph."""


def zipf_shares(size: int, skew: float) -> np.ndarray:
    """Each group rank's share of the tokens every rank sends: ``(j+1)^-skew``, normalised."""
    weights = np.arange(1, size + 1, dtype=np.float64) ** -skew
    return weights / weights.sum()


def token_pairs(lane: np.ndarray, kind: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """(first, second) positions among all-to-all rows (in row order) of each dispatch and its
    combine: the next all-to-all of the same lane and group kind, carrying the same bytes, with
    none of that group between them. Paired greedily, in program order."""
    pairs, last = [], {}
    for i, key in enumerate(zip(lane.tolist(), kind.tolist(), strict=True)):
        j = last.pop(key, None)
        if j is not None and nbytes[j] == nbytes[i]:
            pairs.append((j, i))
        else:
            last[key] = i
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def apply_moe_skew(
    graph: SimGraph, path: Path, skew: float, spec: ClusterSpec, ranks: np.ndarray, subset: np.ndarray | None
) -> np.ndarray:
    """The durations of ``graph`` with its experts' routing skewed (the module docstring)."""
    names = graph_column(path, gf.NAME, subset)
    offsets, values = graph_lists(path, gf.SPLIT_BYTES, subset)
    rows = np.flatnonzero((graph.kind == COLLECTIVE) & (names == "all_to_all") & (np.diff(offsets) > 0))
    if not len(rows):
        raise MoeSkewError(
            f"{path}: no all-to-all of known splits to skew (a graph of a program without experts, or of format < 6)"
        )
    kind = graph_column(path, gf.GROUP_KIND, subset)[rows].astype(str)
    nbytes = graph_column(path, gf.BYTES, subset)[rows]
    size = graph_column(path, gf.GROUP_SIZE, subset)[rows]
    pairs = token_pairs(graph.node_lane()[rows], kind, nbytes)
    dur = graph.dur.copy()
    if not len(pairs):
        return dur
    tables = LayoutTables.build(graph.layout, spec.gpus_per_node)
    model = CommModel(spec)
    rank = ranks[graph.node_rank()]
    token = np.zeros(len(rows), bool)
    token[pairs.ravel()] = True
    compute_factor = np.zeros(len(dur))
    for axis in np.unique(kind[token]):
        on = np.flatnonzero(token & (kind == axis))
        shares = zipf_shares(int(size[on[0]]), skew)
        r = rank[rows[on]]
        splits = split_matrix(path, offsets, values, rows[on], size[on])
        built = tables.all_to_all_volumes(axis, r, tables.relative_splits(axis, r, splits))
        skewed = tables.skewed_volumes(axis, r, nbytes[on], shares)
        price = [
            model.durations_ns(
                "all_to_all", nbytes[on], size[on], tables.nodes_spanned[axis][r], split_volumes=v
            )
            for v in (built, skewed)
        ]
        dur[rows[on]] = np.round(dur[rows[on]] * price[1] / np.maximum(price[0], 1)).astype(np.int64)
        mine = pairs[np.isin(pairs[:, 0], on)]  # this kind's pairs: the experts' work lies inside
        starts, ends = rows[mine[:, 0]], rows[mine[:, 1]]
        factor = len(shares) * shares[tables.position(axis, rank[starts])]
        delta = np.zeros(len(dur) + 1)
        np.add.at(delta, starts + 1, factor)
        np.add.at(delta, ends, -factor)
        compute_factor += np.cumsum(delta)[:-1]
    experts = (graph.kind == COMPUTE) & (compute_factor > 0)
    dur[experts] = np.round(dur[experts] * compute_factor[experts]).astype(np.int64)
    return dur
