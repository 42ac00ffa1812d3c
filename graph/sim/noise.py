"""Arrival skew: what the members of a collective wait for because their ranks do not run in step.

The engine is deterministic: every rank of a stage runs the same durations, so the members of a
collective arrive together. Real ranks do not: each one's time since their last common
synchronisation varies, and a collective starts at its *last* arrival. For ``p`` members whose
arrival times are independent with standard deviation ``sigma``, the last one comes on average
``e_p * sigma`` after the mean (``e_p`` = expected maximum of ``p`` standard normals: 0.56 for
2, 1.42 for 8, 2.4 for 64), and that wait is what ``skew_ns`` adds to the collective.

``sigma`` is taken as ``cv * interval``: ``interval`` is the work a member does between the
previous collective of the same group and this one (compute durations and gaps of its
program; the program repeats, so the first collective of an iteration looks back to the last
one of the previous iteration), ``cv`` the coefficient of variation of the captured rank's
clean unprofiled iteration times. This assumes the noise is correlated over an interval (a slow
spell slows a whole stretch of work), which is what real runs on a shared machine show: two
data-parallel ranks doing identical work reach their gradient all-reduce far further apart than
independent per-op noise would give. On a quiet cluster ``cv`` is
small and so is the skew; on a noisy one it is where the time goes.

Short intervals have a noise floor of their own: a rank that calls a collective every
millisecond (tp) reaches each call early or late by a fraction of a millisecond on a shared
machine (scheduling, the previous call's wake-up), independently of ``cv`` times a millisecond. ``call_jitter_ns``
measures it from the captured rank's own calls: the spread, across clean unprofiled
iterations, of the time between one call's return and the next call. The two add as
independent noises: ``sigma = sqrt((cv * interval)**2 + jitter**2)``.
"""

from __future__ import annotations

import math
import statistics
from functools import cache

import numpy as np

from prism.schemas.iterations import clean_unprofiled

MIN_CLEAN_FOR_CV = 3
"""Clean unprofiled iterations needed to estimate the noise; fewer gives cv = 0 (no skew)."""


@cache
def expected_max_normal(p: int) -> float:
    """E[max of ``p`` independent standard normals] (0 for one member)."""
    if p <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 16001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    integrand = x * p * pdf * cdf ** (p - 1)
    return float(np.sum((integrand[1:] + integrand[:-1]) * 0.5 * np.diff(x)))


@cache
def max_normal_sd(p: int) -> float:
    """Standard deviation of the max of ``p`` independent standard normals (1 for one member)."""
    if p <= 1:
        return 1.0
    x = np.linspace(-8.0, 8.0, 16001)
    density = p * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    density *= (0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))) ** (p - 1)
    dx = np.diff(x)
    second = float(np.sum(((x * x * density)[1:] + (x * x * density)[:-1]) * 0.5 * dx))
    return math.sqrt(max(second - expected_max_normal(p) ** 2, 0.0))


def virtual_lateness_ns(
    skew_ns: np.ndarray, members: np.ndarray, real_members: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """How late the virtual members of collectives come, when ``real_members`` of them are real.

    A collective's ``skew_ns`` is ``e_p * sigma`` for its ``p = members``; the last of its
    ``k = p - real_members`` virtual members comes ``e_k * sigma`` after their mean on average,
    spread by the order statistic's own deviation. Returns (mean, spread) in ns; the mean is -1
    where every member is real.
    """
    p = np.asarray(members, np.int64)
    k = p - np.asarray(real_members, np.int64)
    e_p = np.array([expected_max_normal(int(v)) for v in p]) if len(p) else np.zeros(0)
    sigma = np.divide(np.asarray(skew_ns, np.float64), e_p, out=np.zeros(len(p)), where=e_p > 0)
    mu = np.array([expected_max_normal(int(v)) for v in k]) * sigma if len(p) else np.zeros(0)
    sd = np.array([max_normal_sd(int(v)) for v in k]) * sigma if len(p) else np.zeros(0)
    return np.where(k > 0, mu, -1.0), np.where(k > 0, sd, 0.0)


def iteration_cv(iteration_ns: tuple[int, ...], warmup: int) -> float:
    """Coefficient of variation of the clean unprofiled iterations (0 with too few of them)."""
    clean = clean_unprofiled(iteration_ns, warmup)
    if len(clean) < MIN_CLEAN_FOR_CV:
        return 0.0
    return statistics.stdev(clean) / statistics.mean(clean)


def call_jitter_ns(
    entry_ns: np.ndarray, exit_ns: np.ndarray, per_iteration: int, total_iterations: int, warmup: int
) -> float:
    """Noise floor of the time between a rank's consecutive calls, in ns (0 when unknown).

    ``entry_ns`` / ``exit_ns``: every call of the rank in order, set-up calls first, then
    ``per_iteration`` calls in each of ``total_iterations`` iterations. For each position in the iteration (the first excepted: it
    spans the iteration boundary), the standard deviation of (entry − previous exit) across
    the clean unprofiled iterations; the median over positions, so that a few long, drifting
    intervals do not stand for the many short ones.
    """
    calls, iterations = len(entry_ns), total_iterations
    setup = calls - per_iteration * iterations
    if per_iteration < 2 or iterations < 1 or setup < 0:
        return 0.0
    idle = np.asarray(entry_ns[setup + 1 :], np.float64) - np.asarray(exit_ns[setup:-1], np.float64)
    by_iteration = np.concatenate([[np.nan], idle]).reshape(iterations, per_iteration)[:, 1:]
    clean = np.array(clean_unprofiled(list(by_iteration), warmup))
    if len(clean) < MIN_CLEAN_FOR_CV:
        return 0.0
    return float(np.sqrt(np.median(np.var(clean, axis=0, ddof=1))))


def collective_skew_ns(
    work_ns: np.ndarray, own_ns: np.ndarray, axis: np.ndarray, group_sizes: dict[str, int], cv: float,
    jitter_ns: float = 0.0,
) -> np.ndarray:  # fmt: skip
    """Expected extra wait of every collective of one rank's program, in ns (0 elsewhere).

    ``work_ns``: per node, the time the rank spends on it by itself (compute duration + gap;
    for comm nodes only the gap). ``own_ns``: the part of ``work_ns`` after the node's arrival
    (a compute node's duration; 0 for comm nodes). ``axis``: the group axis of each
    collective, "" for other nodes. ``group_sizes``: members of a group of each axis.
    ``jitter_ns``: the rank's per-call noise floor (``call_jitter_ns``).
    """
    skew = np.zeros(len(work_ns), np.int64)
    if (cv <= 0 and jitter_ns <= 0) or len(work_ns) == 0:
        return skew
    for name, size in group_sizes.items():
        rows = np.flatnonzero(axis == name)
        if size <= 1 or len(rows) == 0:
            continue
        interval = work_between(work_ns, own_ns, rows)
        sigma = np.hypot(cv * interval, jitter_ns)
        skew[rows] = np.round(expected_max_normal(size) * sigma).astype(np.int64)
    return skew


def work_between(
    work_ns: np.ndarray, own_ns: np.ndarray, rows: np.ndarray, rank_ptr: np.ndarray | None = None
) -> np.ndarray:
    """Work each of ``rows`` is preceded by since the previous one of its rank, arrival to arrival.

    ``rows`` (ascending) are nodes of one program, or of a whole graph whose rows are grouped
    by rank (``rank_ptr``). Programs repeat every iteration, so a rank's first row looks back
    to its last one, one iteration earlier. ``work_ns`` and ``own_ns`` as in
    ``collective_skew_ns``.
    """
    if len(rows) == 0:
        return np.zeros(0, np.float64)
    if rank_ptr is None:
        rank_ptr = np.array([0, len(work_ns)])
    cum = np.concatenate([[0.0], np.cumsum(work_ns, dtype=np.float64)])
    arrival = cum[rows + 1] - own_ns[rows]  # work done when each row is reached
    rank = np.searchsorted(rank_ptr, rows, side="right") - 1
    interval = np.diff(arrival, prepend=0.0)
    first = np.r_[True, rank[1:] != rank[:-1]]
    last = np.r_[rank[1:] != rank[:-1], True]
    total = cum[rank_ptr[rank + 1]] - cum[rank_ptr[rank]]  # each rank's work per iteration
    last_arrival = arrival[last][np.cumsum(first) - 1]  # of the row's rank
    interval[first] = (arrival + total - last_arrival)[first]
    return interval


def work_in_flight(
    own_ns: np.ndarray,
    gap_ns: np.ndarray,
    calls: np.ndarray,
    deps_ptr: np.ndarray,
    deps: np.ndarray,
    rank_ptr: np.ndarray | None = None,
) -> np.ndarray:
    """The work each asynchronous call of ``calls`` has its rank do while it is in flight: the
    compute (``own_ns``) and gaps of the nodes after it up to the first later node of its lane
    that depends on it (its wait), and that node's gap; 0 for a call nothing there waits for.

    Nodes are in program order, grouped by lane (``rank_ptr``: where each lane's nodes begin,
    then the end; None: one lane); ``deps_ptr``/``deps`` list each node's dependencies (CSR,
    node indices)."""
    calls = np.asarray(calls, dtype=np.int64)
    if len(calls) == 0:
        return np.zeros(0, np.int64)
    n = len(own_ns)
    if rank_ptr is None:
        rank_ptr = np.array([0, n])
    lane = np.searchsorted(rank_ptr, np.arange(n), side="right") - 1
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(deps_ptr))
    deps = np.asarray(deps, dtype=np.int64)
    waits = (owner > deps) & (lane[owner] == lane[deps])
    first_wait = np.full(n, n, np.int64)
    np.minimum.at(first_wait, deps[waits], owner[waits])
    gap = np.asarray(gap_ns, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(np.asarray(own_ns, dtype=np.int64) + gap)])
    wait = first_wait[calls]
    at = np.minimum(wait, n - 1)
    between = cum[at] - cum[calls + 1] + gap[at]
    return np.where(wait < n, np.maximum(between, 0), 0)
