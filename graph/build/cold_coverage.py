"""Whether the cluster spec's ``cold_call`` table reaches the compute gaps of the graph's collectives.

The comm model adds a collective's cold latency by the compute its rank did since its previous
call, interpolated in the spec's table and flat past its last gap (``ClusterSpec.cold_extra_s``).
On a CPU test bed that latency keeps growing well past the few milliseconds a tensor-parallel
call waits (a 2-process gloo all-reduce of 64 KiB-8 MiB: within 0.15 ms of back to back after
4 ms of compute, +0.4-0.7 ms after 16 ms, +0.5-1.6 ms after 64 ms;
benchmarks/results/cold_gaps.txt), and a gradient all-reduce comes after the whole backward: a
table that stops short prices it as after its last gap.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from prism.graph.build.bind import AXIS_CODES, EncodedProgram, axis_size
from prism.graph.build.compose import IDLE
from prism.schemas.cluster import ClusterSpec
from prism.schemas.layout import ParallelLayout

REACH_FACTOR = 2.0
"""A gap this many times the table's last one is said to be out of its reach."""


def longest_collective_gap_ns(stages: Iterable[EncodedProgram], layout: ParallelLayout) -> int:
    """The most compute any collective of ``stages`` over more than one rank comes after (0: none)."""
    shared = [code for axis, code in AXIS_CODES.items() if axis_size(layout, axis) > 1]
    longest = 0
    for e in stages:
        collective = e.columns["is_coll"] & np.isin(e.columns["axis_code"], shared)
        if collective.any():
            longest = max(longest, int(e.columns[IDLE][collective].max()))
    return longest


def uncovered_cold_gaps(
    stages: Iterable[EncodedProgram], layout: ParallelLayout, cluster: ClusterSpec
) -> str | None:
    """A line for the user when ``cluster``'s cold table stops well short of the graph's gaps."""
    reach_s = cluster.cold_reach_s
    if reach_s <= 0:
        return None
    longest_ms = longest_collective_gap_ns(stages, layout) / 1e6
    if longest_ms <= REACH_FACTOR * reach_s * 1e3:
        return None
    suggested = ",".join(f"{g:g}" for g in _gaps_up_to(longest_ms))
    return (
        f"the cluster spec's cold_call table stops at {reach_s * 1e3:g} ms of compute, but collectives of "
        f"this graph come after up to {longest_ms:.0f} ms and are priced as after {reach_s * 1e3:g} ms: "
        f"calibrate with prism-calibrate --cold-gaps-ms {suggested}"
    )


def _gaps_up_to(longest_ms: float) -> list[float]:
    """0.5, 1, 2, 4, then powers of four up to the first at or past ``longest_ms``."""
    gaps = [0.5, 1.0, 2.0, 4.0]
    while gaps[-1] < longest_ms:
        gaps.append(gaps[-1] * 4)
    return gaps
