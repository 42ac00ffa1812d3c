"""The α-β communication cost model: how long a collective or transfer takes on a cluster.

Arguments of every call, as in the comm log (``prism.schemas.comm_log``):

- ``n`` (``bytes``): bytes *this rank contributes*, i.e. its input. For all_reduce, broadcast,
  reduce, reduce_scatter and all_to_all that is the whole tensor; for all_gather and gather it is
  one shard (the output is p·n); for scatter it is the shard received; for send/recv the message.
- ``p`` (``group_size``): members of the group. A collective with p = 1 costs 0; send/recv ignore p.
- ``k`` (``nodes_spanned``): distinct nodes holding members (``rank // gpus_per_node``); for
  send/recv 1 when both ends share a node, else 2. Members are assumed spread evenly, which every
  layout group is: ``g = p // k`` members per node.

Spec terms (``prism.schemas.cluster.ClusterSpec``): ``α_i, α_e`` intra/inter-node hop latency,
``B_i, B_e`` intra/inter-node bandwidth per GPU and direction, ``α_0`` the base latency of a call,
``e_c`` and ``f_c`` the bandwidth efficiency and latency factor of op class ``c``.

Bottleneck bandwidth of a ring or tree: ``B = B_i`` on one node; across nodes every ring leaves
each node once and NCCL runs one channel per NIC, so the g members of a node drive g NICs in
parallel: ``B = min(B_i, g·B_e)``. Hop latency: a ring of p members over k nodes has k - 1
network hops per pass (NCCL's ``nInterSteps``), the others are intra-node.

Durations (seconds; rounded to integer ns)::

    ring all_reduce   α_0 + f·(2(p-k)·α_i + 2(k-1)·α_e) + 2(p-1)/p · n/(e·B)
    tree all_reduce   α_0 + f·2((g-1)·α_i + ⌈log2 k⌉·α_e) + 2·n/(e·B)
    all_reduce        min(ring, tree)                                   (as NCCL's tuner picks)
    barrier           α_0 + f·min(ring hops, tree hops)                  (latency only)
    all_gather        α_0 + f·((p-k)·α_i + (k-1)·α_e) + (p-1)·n/(e·B)    (= (p-1)/p · pn/(e·B))
    reduce_scatter    α_0 + f·((p-k)·α_i + (k-1)·α_e) + (p-1)/p · n/(e·B)
    broadcast, reduce α_0 + f·((p-k)·α_i + (k-1)·α_e) + n/(e·B)          (pipelined chain)
    all_to_all        α_0 + f·((g-1)·α_i + (p-g)·α_e) + max((g-1)/p·n/(e·B_i), (p-g)/p·n/(e·B_e))
    gather, scatter   α_0 + f·((g-1)·α_i + (p-g)·α_e) + max((g-1)·n/(e·B_i), (p-g)·n/(e·B_e))
    send, recv        α_0 + f·α_link + n/(e·B_link)       (link: intra if k == 1, else inter)

all_to_all, gather and scatter move data point to point: the off-node part goes through the
rank's own NIC only (no aggregation), the on-node part over NVLink, concurrently. An all_to_all
whose split sizes are known is priced by the bytes each pair exchanges instead of by even shares
(``split_volumes``: ``n_i`` and ``n_e``, the most any member of the group sends or receives on
its node and off it, ``prism.graph.comm.placement.LayoutTables.all_to_all_volumes``)::

    all_to_all        α_0 + f·((g-1)·α_i + (p-g)·α_e) + max(n_i/(e·B_i), n_e/(e·B_e))

Measured points (the spec's ``measured`` table) override these lines for calls whose group sits
on one node (k = 1) where the spec lists the op class and group size: the time is interpolated
linearly in n between the points, is the first point's below them, and past the last point grows
by the α-β line's own slope, ``T(n) = T_last + line(n) − line(n_last)``. A local machine's gloo
collectives are not one line (small all-reduces can cost more than 64 KiB ones).
"""

from __future__ import annotations

import numpy as np

from prism.schemas.cluster import ClusterSpec
from prism.schemas.comm_log import P2P_OPS
from prism.schemas.layout import ParallelLayout

OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "barrier",
    "all_to_all",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
)
"""Operation names of the comm log."""
_CHAIN_OPS = ("all_gather", "reduce_scatter", "broadcast", "reduce")


def op_class(op: str) -> str:
    """The ClusterSpec factor key of a comm-log op (send/recv -> 'p2p'; all_reduce -> ring class)."""
    if op not in OPS:
        raise ValueError(f"unknown comm op {op!r}; expected one of {', '.join(OPS)}")
    return "p2p" if op in P2P_OPS else op


class CommModel:
    """Durations of collectives and transfers under a cluster spec (see the module docstring)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        # The measured points as (bytes, seconds) arrays, by op class and group size.
        self._points = {
            cls: {p: tuple(np.array(column, dtype=np.float64) for column in zip(*points, strict=True))
                  for p, points in by_size.items()}
            for cls, by_size in spec.measured.items()
        }  # fmt: skip

    def duration_ns(self, op: str, bytes: int, group_size: int, nodes_spanned: int) -> int:
        """Duration of one call in ns."""
        return int(
            self.durations_ns(op, np.array([bytes]), np.array([group_size]), np.array([nodes_spanned]))[0]
        )

    def durations_ns(
        self,
        op: str | np.ndarray,
        bytes: np.ndarray,
        group_size: np.ndarray,
        nodes_spanned: np.ndarray,
        overlap_ns: np.ndarray | None = None,
        split_volumes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Durations in ns (int64) of many calls at once; arguments broadcast against each other.

        ``op`` is one name for all rows or an array of names; the work is vectorised per
        distinct op, never per row. ``overlap_ns``, the compute each call's rank does while the
        call is in flight (an asynchronous call, up to its wait), stretches collectives by the
        spec's ``busy_call`` factor ``f``: the call progresses at ``1/f`` of its idle rate while
        its rank computes and at the full rate after, so a price ``D`` becomes
        ``min(f·D, D + overlap·(1 − 1/f))``. ``split_volumes``, (calls, 2), the on-node and
        off-node bytes that bound each all_to_all whose splits are known (NaN where they are
        not), prices those by them (the module docstring).
        """
        durations = self._durations_ns(op, bytes, group_size, nodes_spanned, split_volumes)
        if overlap_ns is None or not self.spec.busy_call:
            return durations
        ops = np.broadcast_to(np.asarray(op), durations.shape)
        collective = (np.asarray(group_size) > 1) & ~np.isin(ops, list(P2P_OPS))
        factor = self.spec.busy_factor(bytes)
        overlap = np.maximum(np.asarray(overlap_ns, dtype=np.float64), 0.0)
        busy = np.rint(np.minimum(durations * factor, durations + overlap * (1.0 - 1.0 / factor))).astype(
            np.int64
        )
        return np.where(collective, busy, durations)

    def _durations_ns(self, op, bytes, group_size, nodes_spanned, split_volumes=None) -> np.ndarray:
        n, p, k = np.broadcast_arrays(
            np.asarray(bytes, dtype=np.float64), np.asarray(group_size), np.asarray(nodes_spanned)
        )
        p, k = p.astype(np.int64), k.astype(np.int64)
        _check(n, k)
        volumes = None
        if split_volumes is not None:
            volumes = np.broadcast_to(np.asarray(split_volumes, dtype=np.float64), (*n.shape, 2))
        if isinstance(op, str):
            return _to_ns(self._priced(op, n, p, k, volumes))
        ops = np.broadcast_to(np.asarray(op), n.shape)
        seconds, seen = np.zeros(n.shape, dtype=np.float64), np.zeros(n.shape, dtype=bool)
        for name in OPS:  # one equality pass per known op: cheaper than sorting names
            rows = ops == name
            if rows.any():
                seconds[rows] = self._priced(
                    name, n[rows], p[rows], k[rows], None if volumes is None else volumes[rows]
                )
                seen |= rows
        if not seen.all():
            unknown = ", ".join(map(repr, np.unique(ops[~seen]).tolist()[:5]))
            raise ValueError(f"unknown comm op(s) {unknown}; expected one of {', '.join(OPS)}")
        return _to_ns(seconds)

    # -- per op ----------------------------------------------------------------------------------
    def _priced(self, op: str, n, p, k, volumes: np.ndarray | None) -> np.ndarray:
        """``_seconds``, with all_to_alls of known splits priced by their volumes where no measured
        point applies (a measured group on one node is timed by its total bytes)."""
        seconds = self._seconds(op, n, p, k)
        if op != "all_to_all" or volumes is None:
            return seconds
        measured = (k == 1) & np.isin(p, list(self._points.get(op, {})))
        rows = np.isfinite(volumes).all(axis=1) & (p > 1) & ~measured
        if rows.any():
            seconds = np.array(seconds, dtype=np.float64)
            seconds[rows] = self._point_to_point(op, volumes[rows, 0], volumes[rows, 1], p[rows], k[rows])
        return seconds

    def _seconds(self, op: str, n: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        cls = op_class(op)
        if cls == "p2p":
            return self._measured(cls, n, np.full_like(p, 2), k, lambda n, p, k: self._p2p(n, k))
        if np.any(p < 1) or np.any(k > p):
            raise ValueError(f"{op}: group_size must be at least 1 and at least nodes_spanned")
        out = self._measured(cls, n, p, k, lambda n, p, k: self._line(cls, n, p, k))
        return np.where(p > 1, out, 0.0)

    def _line(self, cls: str, n: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        if cls == "all_reduce":
            return np.minimum(self._ring_all_reduce(n, p, k), self._tree_all_reduce(n, p, k))
        if cls == "barrier":
            hops = np.minimum(_ring_hop_s(self.spec, p, k, 2), _tree_hop_s(self.spec, p, k))
            return self.spec.base_latency_s + self.spec.latency_scale(cls) * hops
        if cls in _CHAIN_OPS:
            return self._chain(cls, n, p, k)
        return self._direct(cls, n, p, k)

    def _measured(self, cls: str, n: np.ndarray, p: np.ndarray, k: np.ndarray, line) -> np.ndarray:
        """``line(n, p, k)``, overridden by the spec's measured points where they apply."""
        out = line(n, p, k)
        tables = self._points.get(cls, {})
        if tables:
            out = np.array(out, dtype=np.float64)  # writable, whatever the line returned
        for size, (sizes, seconds) in tables.items():
            rows = (p == size) & (k == 1)
            if not rows.any():
                continue
            x = n[rows]
            last = np.full_like(x, sizes[-1])
            past = seconds[-1] + line(x, p[rows], k[rows]) - line(last, p[rows], k[rows])
            out[rows] = np.where(x > sizes[-1], past, np.interp(x, sizes, seconds))
        return out

    def _ring_all_reduce(self, n: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        s = self.spec
        lat = s.base_latency_s + s.latency_scale("all_reduce") * _ring_hop_s(s, p, k, 2)
        return lat + 2 * (p - 1) / p * n / (s.efficiency("all_reduce") * _ring_bw(s, p, k))

    def _tree_all_reduce(self, n: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        s = self.spec
        lat = s.base_latency_s + s.latency_scale("all_reduce_tree") * _tree_hop_s(s, p, k)
        return lat + 2 * n / (s.efficiency("all_reduce_tree") * _ring_bw(s, p, k))

    def _chain(self, cls: str, n: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        s = self.spec
        volume = {"all_gather": (p - 1) * n, "reduce_scatter": (p - 1) / p * n}.get(cls, n)
        lat = s.base_latency_s + s.latency_scale(cls) * _ring_hop_s(s, p, k, 1)
        return lat + volume / (s.efficiency(cls) * _ring_bw(s, p, k))

    def _direct(self, cls: str, n: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
        g = _per_node(p, k)
        per_peer = n / p if cls == "all_to_all" else n
        return self._point_to_point(cls, (g - 1) * per_peer, (p - g) * per_peer, p, k)

    def _point_to_point(self, cls: str, on_node: np.ndarray, off_node: np.ndarray, p, k) -> np.ndarray:
        """A call that sends ``on_node`` bytes to its node's members and ``off_node`` to the rest,
        one message per member, both at once."""
        s = self.spec
        g, eff = _per_node(p, k), s.efficiency(cls)
        hops = (g - 1) * s.intra_latency_s + (p - g) * s.inter_latency_s
        transfer = np.maximum(
            on_node / (eff * s.intra_bandwidth_bytes_per_s), off_node / (eff * s.inter_bandwidth_bytes_per_s)
        )
        return s.base_latency_s + s.latency_scale(cls) * hops + transfer

    def _p2p(self, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        s = self.spec
        if np.any(k > 2):
            raise ValueError("send/recv: nodes_spanned must be 1 (same node) or 2")
        same = k == 1
        alpha = np.where(same, s.intra_latency_s, s.inter_latency_s)
        bw = np.where(same, s.intra_bandwidth_bytes_per_s, s.inter_bandwidth_bytes_per_s)
        return s.base_latency_s + s.latency_scale("p2p") * alpha + n / (s.efficiency("p2p") * bw)


def _to_ns(seconds: np.ndarray) -> np.ndarray:
    return np.rint(seconds * 1e9).astype(np.int64)


def _check(n: np.ndarray, k: np.ndarray) -> None:
    if np.any(n < 0) or not np.all(np.isfinite(n)):
        raise ValueError("bytes must be finite and non-negative")
    if np.any(k < 1):
        raise ValueError("nodes_spanned must be at least 1")


def _per_node(p: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Members per node, g = p // k (the least-populated node of an uneven group has at most g)."""
    return np.maximum(p // k, 1)


def _ring_bw(s: ClusterSpec, p: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Bottleneck bandwidth of a ring/tree: B_i on one node, min(B_i, g·B_e) across nodes."""
    across = np.minimum(s.intra_bandwidth_bytes_per_s, _per_node(p, k) * s.inter_bandwidth_bytes_per_s)
    return np.where(k > 1, across, s.intra_bandwidth_bytes_per_s)


def _ring_hop_s(s: ClusterSpec, p: np.ndarray, k: np.ndarray, passes: int) -> np.ndarray:
    """Latency of ``passes`` ring passes: (p-k) intra hops and (k-1) network hops each."""
    return passes * ((p - k) * s.intra_latency_s + (k - 1) * s.inter_latency_s)


def _tree_hop_s(s: ClusterSpec, p: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Up and down a tree: a chain of g-1 hops in the node, ⌈log2 k⌉ hops between nodes."""
    depth = np.ceil(np.log2(np.maximum(k, 1)))
    return 2 * ((_per_node(p, k) - 1) * s.intra_latency_s + depth * s.inter_latency_s)


# -- single-node terms (what calibration fits) -------------------------------------------------


def single_node_terms(op: str, bytes: np.ndarray, group_size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hops, volume) with ``T = f_c·hops·α + volume/(e_c·B)`` for a group on one node.

    all_reduce is taken as the ring (on one node the tree is never cheaper); α_0 = 0.
    """
    n = np.asarray(bytes, dtype=np.float64)
    p = np.asarray(group_size, dtype=np.float64)
    cls = op_class(op)
    if cls == "p2p":
        return np.ones_like(n), n
    hops = {"all_reduce": 2 * (p - 1), "barrier": 2 * (p - 1)}.get(cls, p - 1)
    volume = {
        "all_reduce": 2 * (p - 1) / p * n,
        "barrier": 0 * n,
        "all_gather": (p - 1) * n,
        "reduce_scatter": (p - 1) / p * n,
        "all_to_all": (p - 1) / p * n,
        "gather": (p - 1) * n,
        "scatter": (p - 1) * n,
    }.get(cls, n)
    return np.broadcast_to(hops, n.shape).astype(np.float64), np.broadcast_to(volume, n.shape)


# -- where groups sit --------------------------------------------------------------------------


def nodes_spanned(ranks: np.ndarray | list[int] | tuple[int, ...], gpus_per_node: int) -> int | np.ndarray:
    """Distinct nodes (rank // gpus_per_node) of one group (1-D ranks -> int) or of each row of a
    (groups, members) array (-> array of shape (groups,))."""
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be positive, got {gpus_per_node}")
    nodes = np.sort(np.asarray(ranks, dtype=np.int64) // gpus_per_node, axis=-1)
    spanned = 1 + np.count_nonzero(np.diff(nodes, axis=-1), axis=-1)
    return int(spanned) if np.ndim(spanned) == 0 else spanned


def p2p_nodes_spanned(src: np.ndarray, dst: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """1 where both ends of a transfer share a node, else 2."""
    same = np.asarray(src) // gpus_per_node == np.asarray(dst) // gpus_per_node
    return np.where(same, 1, 2)


def layout_nodes_spanned(layout: ParallelLayout, axis: str, gpus_per_node: int) -> np.ndarray:
    """Nodes spanned by each group of ``axis`` ('tp', 'dp', 'pp') of a ParallelLayout, by group index."""
    return nodes_spanned(np.array(layout.groups(axis), dtype=np.int64), gpus_per_node)
