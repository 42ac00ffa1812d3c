"""What-ifs: change a built graph's timings before simulating it, without rebuilding.

- a slow rank: its compute nodes take ``factor`` times as long (``123:+20%``);
- a delay on a block: every instance of a block (phase, optionally layer) starts later by a
  fixed time, on every rank or one (``bwd,layer=3:+1ms`` or ``fwd:+200us@123``);
- another cluster: every collective and transfer is re-costed with another cluster spec;
- routing imbalance between experts (``--moe-skew``, ``prism.graph.sim.moe_skew``).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from prism.graph.comm.placement import LayoutTables
from prism.graph.io.reader import read_metadata
from prism.graph.sim.engine import COMPUTE, RECV, SEND
from prism.graph.sim.load import graph_column, graph_lists, split_matrix, wake_of
from prism.graph.sim.moe_skew import apply_moe_skew
from prism.graph.sim.noise import work_in_flight
from prism.graph.sim.simulate import SimGraph
from prism.peers.comm_model import CommModel
from prism.schemas import graph_format as gf
from prism.schemas.annotations import Part
from prism.schemas.cluster import ClusterSpec

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


class WhatIfError(ValueError):
    """A what-if that cannot be read or applied."""


@dataclass(frozen=True, kw_only=True)
class SlowRank:
    """A rank whose compute is slower."""

    rank: int
    """Global rank."""
    factor: float
    """Multiplier of its compute durations (1.2 = 20% slower)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise WhatIfError(
                f"slow rank {self.rank}: its factor must be above 0 and finite, got {self.factor}"
            )


@dataclass(frozen=True, kw_only=True)
class BlockDelay:
    """Extra time before every instance of a block."""

    phase: str
    """Block phase, e.g. fwd, bwd, grad_sync, optim."""
    layer: int | None
    """Global layer, or None for every node of the phase."""
    delay_ns: int
    """Added before the block's first node."""
    rank: int | None = None
    """Only this rank, or None for all."""


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    """Changes to simulate."""

    slow_ranks: tuple[SlowRank, ...] = ()
    delays: tuple[BlockDelay, ...] = ()
    cluster: ClusterSpec | None = None
    moe_skew: float | None = None
    """Zipf exponent of the tokens' routing over each all-to-all group (``prism.graph.sim.moe_skew``)."""

    def __post_init__(self) -> None:
        if self.moe_skew is not None and not (math.isfinite(self.moe_skew) and self.moe_skew >= 0):
            raise WhatIfError(f"--moe-skew must be 0 or more and finite, got {self.moe_skew}")

    def to_dict(self) -> dict:
        return {
            "slow_ranks": [asdict(s) for s in self.slow_ranks],
            "delays": [asdict(d) for d in self.delays],
            "cluster": None if self.cluster is None else self.cluster.name,
            "moe_skew": self.moe_skew,
        }

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks it changes alone (the others it changes alike or not at all)."""
        return tuple(
            sorted({s.rank for s in self.slow_ranks} | {d.rank for d in self.delays if d.rank is not None})
        )

    @property
    def empty(self) -> bool:
        return not (self.slow_ranks or self.delays or self.cluster or self.moe_skew is not None)


_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"  # a plain decimal: no sign, no exponent, one point at most


def parse_duration(text: str) -> int:
    match = re.fullmatch(rf"\+?{_NUMBER}\s*(ns|us|µs|ms|s)", text.strip())
    if not match:
        raise WhatIfError(f"bad duration {text!r}: write e.g. +200us, 1ms, 0.5s")
    return round(float(match[1]) * _UNITS_NS[match[2]])


def parse_slow_rank(text: str) -> SlowRank:
    """'123:+20%' or '123:x1.5'."""
    match = re.fullmatch(rf"(\d+):(?:\+{_NUMBER}%|x{_NUMBER})", text.strip())
    if not match:
        raise WhatIfError(f"bad slow rank {text!r}: write RANK:+20% or RANK:x1.5")
    factor = 1 + float(match[2]) / 100 if match[2] else float(match[3])
    return SlowRank(rank=int(match[1]), factor=factor)


def parse_delay(text: str) -> BlockDelay:
    """'bwd,layer=3:+1ms' or 'fwd:+200us@123'."""
    match = re.fullmatch(r"(\w+)(?:,layer=(\d+))?:([^@]+)(?:@(\d+))?", text.strip())
    if not match:
        raise WhatIfError(f"bad delay {text!r}: write PHASE[,layer=L]:+DURATION[@RANK]")
    layer = int(match[2]) if match[2] else None
    rank = int(match[4]) if match[4] else None
    return BlockDelay(phase=match[1], layer=layer, delay_ns=parse_duration(match[3]), rank=rank)


def _slow(graph: SimGraph, slow: tuple[SlowRank, ...], ranks: np.ndarray) -> np.ndarray:
    dur = graph.dur.copy()
    for s in slow:
        at = int(np.searchsorted(ranks, s.rank))
        if at == len(ranks) or ranks[at] != s.rank:
            raise WhatIfError(f"slow rank {s.rank} is not in the graph (0..{graph.layout.world_size - 1})")
        rows = graph.rank_rows(at)  # a slice: every stream of the rank
        rank_dur, compute = dur[rows], graph.kind[rows] == COMPUTE  # rank_dur: a view into dur
        rank_dur[compute] = np.round(rank_dur[compute] * s.factor).astype(np.int64)
    return dur


def _delays(graph: SimGraph, path: Path, delays: tuple[BlockDelay, ...], ranks: np.ndarray) -> np.ndarray:
    gap = graph.gap.copy()
    columns = (gf.PHASE, gf.LAYER, gf.MB, gf.PART)
    phase, layer, mb, part = (graph_column(path, c, _subset(graph, ranks)) for c in columns)
    rank = ranks[graph.node_rank()]
    for d in delays:
        mask = phase == d.phase
        if d.layer is not None:
            # The block's own pass, where a replay's delay waits: not a split backward's weight runs.
            mask &= (layer == d.layer) & (part != str(Part.WEIGHTS))
        if d.rank is not None:
            mask &= rank == d.rank
        if not mask.any():
            raise WhatIfError(
                f"no block matches the delay {d.phase}{'' if d.layer is None else f',layer={d.layer}'}"
            )
        # The first node of each instance: where the match begins or the microbatch changes.
        first = mask & ~np.r_[False, mask[:-1] & (mb[1:] == mb[:-1]) & (rank[1:] == rank[:-1])]
        gap[first] += d.delay_ns
    return gap


def _recost(graph: SimGraph, path: Path, spec: ClusterSpec, ranks: np.ndarray) -> np.ndarray:
    comm = graph.kind != COMPUTE
    rank = ranks[graph.node_rank()][comm]
    subset = _subset(graph, ranks)
    names = graph_column(path, gf.NAME, subset)
    op = names[comm].astype(str)
    kind = graph_column(path, gf.GROUP_KIND, subset)[comm].astype(str)
    nbytes = graph_column(path, gf.BYTES, subset)[comm]
    size = graph_column(path, gf.GROUP_SIZE, subset)[comm]
    peer = graph_column(path, gf.PEER, subset)[comm]
    tables = LayoutTables.build(graph.layout, spec.gpus_per_node)
    spanned = np.ones(len(rank), np.int32)
    for axis, table in tables.nodes_spanned.items():
        on = kind == axis
        spanned[on] = table[rank[on]]
    p2p = np.isin(graph.kind[comm], (SEND, RECV))
    spanned[p2p] = 1 + (tables.node_of_rank[rank[p2p]] != tables.node_of_rank[peer[p2p]])
    own = np.where(comm, 0, graph.dur)
    calls = np.flatnonzero(comm)
    computing = np.where(names == gf.POST_NAME, 0, own)  # as the build: a post is its call's own work
    overlap = np.where(
        graph.is_async[calls],
        work_in_flight(computing, graph.gap, calls, graph.deps_ptr, graph.deps, graph.rank_ptr),
        0,
    )
    volumes = _split_volumes(path, subset, comm, rank, kind, size, tables)
    dur = graph.dur.copy()
    dur[comm] = CommModel(spec).durations_ns(
        op, nbytes, size, spanned, overlap_ns=overlap, split_volumes=volumes
    )
    return dur


def _split_volumes(
    path: Path,
    subset: np.ndarray | None,
    comm: np.ndarray,
    rank: np.ndarray,
    kind: np.ndarray,
    size: np.ndarray,
    tables: LayoutTables,
) -> np.ndarray:
    """(on-node, off-node) bytes that bound each comm node's all-to-all of known splits on
    ``tables``'s nodes, NaN for the rest (``LayoutTables.all_to_all_volumes``)."""
    offsets, values = graph_lists(path, gf.SPLIT_BYTES, subset)
    known = np.diff(offsets)[comm] > 0
    volumes = np.full((len(rank), 2), np.nan)
    for axis in np.unique(kind[known]):
        rows = np.flatnonzero((kind == axis) & known)
        splits = split_matrix(path, offsets, values, np.flatnonzero(comm)[rows], size[rows])
        volumes[rows] = tables.all_to_all_volumes(
            axis, rank[rows], tables.relative_splits(axis, rank[rows], splits)
        )
    return volumes


def _built_with(path: Path) -> ClusterSpec:
    """The cluster spec the graph's communication was priced with."""
    try:
        return ClusterSpec.from_dict(read_metadata(path).cluster)
    except (ValueError, TypeError, KeyError) as e:
        raise WhatIfError(f"{path}: the graph records no usable cluster spec ({e}); pass --cluster") from None


def _subset(graph: SimGraph, ranks: np.ndarray) -> np.ndarray | None:
    """The ranks to read columns of: None when ``graph`` holds every rank of the file."""
    return None if graph.ranks == graph.layout.world_size else ranks


def apply_what_if(
    graph: SimGraph, path: str | Path, what_if: WhatIf, ranks: np.ndarray | None = None
) -> SimGraph:
    """``graph`` with the changes of ``what_if`` (the original is not modified). ``ranks``: the
    rank of the file each rank of ``graph`` is (a folded graph's ``kept_ranks``; default: all)."""
    path = Path(path)
    ranks = np.arange(graph.ranks) if ranks is None else np.asarray(ranks)
    if what_if.cluster is not None:
        graph = replace(
            graph,
            dur=_recost(graph, path, what_if.cluster, ranks),
            wake_ns=wake_of(what_if.cluster.to_dict()),
        )
    if what_if.moe_skew is not None:
        spec = what_if.cluster or _built_with(path)
        graph = replace(
            graph, dur=apply_moe_skew(graph, path, what_if.moe_skew, spec, ranks, _subset(graph, ranks))
        )
    if what_if.slow_ranks:
        graph = replace(graph, dur=_slow(graph, what_if.slow_ranks, ranks))
    if what_if.delays:
        graph = replace(graph, gap=_delays(graph, path, what_if.delays, ranks))
    return graph
