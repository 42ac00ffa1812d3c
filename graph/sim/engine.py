"""The discrete-event core of the simulation: start and end of every node of every rank.

Semantics (each rank one lane of nodes in program order; durations from the graph):

- A rank runs its nodes in program order. Node ``n`` may start at
  ``ready = max(clock + gap_ns[n], end of every node in deps[n])``, where ``clock`` is when the
  program reached it: the end of the previous node, or its *start* if that node is asynchronous.
- compute: ``end = start + dur``.
- collective: every member arrives at its ``start``; the operation runs from the last arrival
  for ``dur`` (the cost model's time) plus ``skew`` (the expected wait for the last member
  that deterministic arrivals do not show, ``prism.graph.sim.noise``), so all members share
  ``end = max(arrivals) + dur + skew``.
  A synchronous call blocks its rank until ``end``; an asynchronous one returns at once and a
  later node waits for it through ``deps``.
- with *external* (real) members (a replay), ``skew`` would count the real ranks' noise twice:
  their arrivals are real and carry it. The virtual members' last arrival is then taken as
  normal around ``their max + mu`` with spread ``sd`` (``Hedge``, the order statistic of the
  virtual members alone), and ``end = E[max(real arrivals, that)] + dur``.
- send / recv: a rendezvous, as gloo and NCCL transfers of activations are: the transfer runs
  from the later of the two posts for ``dur``; both nodes end together.
- a rank that waited for a late peer computes slower after it: the wait's ``wake`` cost
  (``wake_cost``, the spec's ``wake_compute`` table) is added to its next compute node. Only the
  part of a wait spent on members that arrived late counts beyond what the graph's compute
  already holds: the capture's virtual peers were never late, so its compute already ran after
  waits of the call's own length.
- a dependency may be on a node of another rank's lane (a GPU stream's kernel waiting for the
  CPU call that launched it, a synchronizing call waiting for a kernel): the node waits until
  that node has ended, plus the dependency's ``deps_lag`` (a launch latency; 0 without one), and
  any number of lanes may wait on one node.

Link contention between concurrent operations is not modelled, so every end time is a pure
function of the dependencies: ranks are advanced until they block, in any order, and the
result does not depend on that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

COMPUTE, COLLECTIVE, SEND, RECV = 0, 1, 2, 3
_NO_LAG = np.zeros(0, np.int64)  # no dependency has a lag


@numba.njit(cache=True)
def _wake(node, waiting_node, next_waiter, runnable, n_runnable):
    """Queue every rank waiting on ``node`` (a chain: ``waiting_node`` then ``next_waiter``)."""
    r = waiting_node[node]
    waiting_node[node] = -1
    while r >= 0:
        runnable[n_runnable] = r
        n_runnable += 1
        following = next_waiter[r]
        next_waiter[r] = -1
        r = following
    return n_runnable


@numba.njit(cache=True)
def _wait_on(node, r, waiting_node, next_waiter):
    """Rank ``r`` waits until ``node`` has an end."""
    next_waiter[r] = waiting_node[node]
    waiting_node[node] = r


@numba.njit(cache=True)
def _complete(slot, t_end, slot_nodes_ptr, slot_nodes, end, waiting_node, next_waiter, runnable, n_runnable):
    """Set the end of every node of a finished collective/transfer and wake ranks waiting on them."""
    for j in range(slot_nodes_ptr[slot], slot_nodes_ptr[slot + 1]):
        node = slot_nodes[j]
        end[node] = t_end
        if waiting_node[node] >= 0:
            n_runnable = _wake(node, waiting_node, next_waiter, runnable, n_runnable)
    return n_runnable


@numba.njit(cache=True)
def _hedged_end(real_last, virtual_last, mu, sd):
    """E[max(real_last, V)] for the virtual members' last arrival V ~ N(virtual_last + mu, sd²)."""
    m = virtual_last + mu
    if sd <= 0.0:
        return max(real_last, m)
    z = (m - real_last) / sd
    cdf = 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return real_last + (m - real_last) * cdf + sd * pdf


@numba.njit(cache=True)
def _hedged_end_ns(real_last, virtual_last, mu, sd):
    return np.int64(round(_hedged_end(real_last, virtual_last, mu, sd)))


@numba.njit(cache=True)
def ruled_end(t, floor, base, mu, sd, add):
    """The end an ``AnswerRule`` names for an arrival at ``t``: exactly what ``_arrive`` computes."""
    if mu < 0.0:
        return max(t, floor) + add
    return _hedged_end_ns(max(t, floor), base, mu, sd) + add


@numba.njit(cache=True)
def _arrive(i, ready, external, dur, slot, slot_size, slot_nodes_ptr, slot_nodes, start, end, arrived, last_arrival, waiting_node, next_waiter, runnable, n_runnable, hedged, mu, sd, pure, real_last):  # fmt: skip
    """Node ``i`` (a collective or transfer) arrives at ``ready``; completes its instance if last.

    ``last_arrival`` of a hedged slot holds the virtual members' last arrival only."""
    start[i] = ready
    s = slot[i]
    arrived[s] += 1
    mixed = len(hedged) > 0 and hedged[s]
    if mixed and external:
        real_last[s] = max(real_last[s], ready)
    else:
        last_arrival[s] = max(last_arrival[s], ready)
    if arrived[s] == slot_size[s]:
        if not mixed:
            t_end = last_arrival[s] + dur[i]
        elif mu[s] < 0.0:  # every member is real
            t_end = real_last[s] + pure[i]
        else:
            t_end = _hedged_end_ns(real_last[s], last_arrival[s], mu[s], sd[s]) + pure[i]
        n_runnable = _complete(
            s, t_end, slot_nodes_ptr, slot_nodes, end, waiting_node, next_waiter, runnable, n_runnable
        )
    return n_runnable


@numba.njit(cache=True)
def wake_cost(waited, late, wake_wait, wake_extra):
    """Extra ns of a rank's next compute after it waited ``waited`` ns, ``late`` of them for
    members that came late: the table at the whole wait less the table at the wait without them."""
    if len(wake_wait) == 0 or late <= 0:
        return 0
    whole = np.interp(float(waited), wake_wait, wake_extra)
    kept = np.interp(float(max(waited - late, 0)), wake_wait, wake_extra)
    return max(np.int64(round(whole - kept)), np.int64(0))


@numba.njit(cache=True, nogil=True)  # a replay advances it in a thread of the launcher, beside the program
def advance(
    rank_ptr, kind, dur, gap, is_async, slot, slot_size, slot_nodes_ptr, slot_nodes, deps_ptr, deps, deps_lag,
    start, end, arrived, last_arrival, pc, clock, waiting_node, next_waiter, runnable, n_runnable, hedged, mu, sd,
    pure, real_last, wake_wait, wake_extra, owed, budget, target,
):  # fmt: skip
    """Advance every runnable, non-external rank until it blocks or finishes; returns the queue length.

    External ranks are never queued: their nodes' times come from ``Engine.arrive_external``
    and ``Engine.finish_external``, and the driver reads their completions from ``end``.
    Stops early, between nodes, once ``budget`` nodes ran (``budget`` > 0) or node ``target``
    has an end (``target`` >= 0); the rank it was running goes back on top of the queue, so a
    later call goes on where this one stopped (the result does not depend on where that was).
    ``owed``: per lane, the wake cost its next compute node pays (``wake_cost``).
    """
    ran = 0
    while n_runnable > 0:
        n_runnable -= 1
        r = runnable[n_runnable]
        while pc[r] < rank_ptr[r + 1]:
            if (budget > 0 and ran >= budget) or (target >= 0 and end[target] >= 0):
                runnable[n_runnable] = r
                return n_runnable + 1
            ran += 1
            i = pc[r]
            if start[i] >= 0:  # resumed after blocking on this synchronous call
                clock[r] = end[i]
                pc[r] += 1
                waited = end[i] - start[i]
                owed[r] = max(owed[r], wake_cost(waited, waited - dur[i], wake_wait, wake_extra))
                continue
            reached = clock[r] + gap[i]
            ready = reached
            blocked, setter = -1, -1
            for j in range(deps_ptr[i], deps_ptr[i + 1]):
                d = deps[j]
                if end[d] < 0:
                    blocked = d
                    break
                dep_ready = end[d] + (deps_lag[j] if len(deps_lag) else 0)
                if dep_ready > ready:
                    ready, setter = dep_ready, d
            if blocked >= 0:
                _wait_on(blocked, r, waiting_node, next_waiter)
                break
            if setter >= 0 and kind[setter] != COMPUTE:  # waited for a call: how long its peers kept it
                late = min(end[setter] - start[setter] - dur[setter], ready - reached)
                owed[r] = max(owed[r], wake_cost(ready - reached, late, wake_wait, wake_extra))
            if kind[i] == COMPUTE:
                start[i] = ready
                end[i] = ready + dur[i] + owed[r]
                owed[r] = 0
                clock[r] = end[i]
                pc[r] += 1
                if waiting_node[i] >= 0:  # another lane's node depends on it
                    n_runnable = _wake(i, waiting_node, next_waiter, runnable, n_runnable)
                continue
            n_runnable = _arrive(i, ready, False, dur, slot, slot_size, slot_nodes_ptr, slot_nodes, start, end, arrived, last_arrival, waiting_node, next_waiter, runnable, n_runnable, hedged, mu, sd, pure, real_last)  # fmt: skip
            if is_async[i]:
                clock[r] = ready
                pc[r] += 1
            elif end[i] >= 0:
                clock[r] = end[i]
                pc[r] += 1
            else:
                _wait_on(i, r, waiting_node, next_waiter)
                break
    return n_runnable


def rule_end_ns(t_ns: int, floor: int, base: int, mu: float, sd: float, add: int) -> int:
    """``ruled_end`` called from Python; the common rule (no virtual member late: ``mu`` < 0)
    without the compiled call's dispatch (a replayed rank names most of its calls' ends here)."""
    if mu < 0.0:
        return max(t_ns, floor) + add
    return int(ruled_end(t_ns, floor, base, mu, sd, add))


class AnswerRule(NamedTuple):  # a tuple: made at every call of a replayed program
    """A collective or transfer of an external rank whose other members have all arrived: its
    end is a function of the rank's own arrival ``t`` alone, so it can be named at once, where
    the rank is, without asking the engine: ``ruled_end(t, floor, base, mu, sd, add)``
    (``mu`` < 0: ``max(t, floor) + add``; else the hedged end over ``max(t, floor)``)."""

    node: int
    floor: int
    base: int
    mu: float
    sd: float
    add: int

    def end_ns(self, t_ns: int) -> int:
        return rule_end_ns(t_ns, self.floor, self.base, self.mu, self.sd, self.add)


@dataclass(frozen=True)
class Hedge:
    """Per slot: whether real ranks are members (``hedged``), and the virtual members' lateness
    beyond their last mean arrival (mean ``mu``, spread ``sd``, ns; ``mu`` < 0: no virtual member)."""

    hedged: np.ndarray
    mu: np.ndarray
    sd: np.ndarray

    @classmethod
    def none(cls) -> Hedge:
        return cls(np.zeros(0, np.bool_), np.zeros(0, np.float64), np.zeros(0, np.float64))


class Engine:
    """The engine's state over one pass of a graph; ``external`` ranks are driven from outside.

    Offline: ``Engine(...).advance()`` once. Co-simulation: alternate ``advance()`` with
    ``arrive_external`` / ``finish_external`` for the real ranks; with the real ranks' times
    equal to the graph's and no ``hedge``, the result is the offline one exactly.
    """

    def __init__(
        self, g, start_clock: np.ndarray, external: np.ndarray | None = None, hedge: Hedge | None = None,
        order: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        n, n_ranks = len(g.kind), g.lanes
        self.g = g
        self.hedge = hedge or Hedge.none()
        self.busy = g.busy_ns  # duration, plus the expected arrival skew of collectives (cached)
        self.real_last = np.empty(len(self.hedge.hedged), np.int64)
        self.start, self.end, self.waiting_node = (np.empty(n, np.int64) for _ in range(3))
        self.arrived, self.last_arrival = (np.empty(len(g.slot_size), np.int64) for _ in range(2))
        self.pc = np.empty(n_ranks, np.int64)
        self.clock = np.empty(n_ranks, np.int64)
        self.next_waiter = np.empty(n_ranks, np.int64)  # the next rank waiting on the same node
        self.owed = np.zeros(n_ranks, np.int64)  # wake cost each lane's next compute pays
        self.wake_wait, self.wake_extra = g.wake_points()
        self.deps_lag = _NO_LAG if g.deps_lag is None else g.deps_lag
        self.external = np.zeros(n_ranks, np.bool_) if external is None else external.astype(np.bool_)
        # A stack: the last rank runs first. ``order`` (nearest the real ranks first) lets a
        # bounded advance reach what the external ranks wait for before the rest.
        self._internal = (
            np.flatnonzero(~self.external)[::-1] if order is None else order[~self.external[order]][::-1]
        )
        self.runnable = np.zeros(n_ranks, np.int64)  # a rank is queued at most once: while it can run
        self.clear()
        self.restart(start_clock)

    def clear(self) -> None:
        """Forget every node's times: the arrays of a pass, ready for ``restart``. (A co-simulation
        clears a spare engine while it waits, so that a new pass starts without the work.)"""
        for times in (self.start, self.end, self.waiting_node, self.next_waiter):
            times.fill(-1)
        for counts in (self.arrived, self.last_arrival, self.real_last):
            counts.fill(0)

    def restart(self, start_clock: np.ndarray) -> None:
        """Begin a pass of a cleared engine, every rank at ``start_clock``."""
        self.pc[:] = self.g.rank_ptr[:-1]
        self.clock[:] = start_clock
        self.owed.fill(0)
        self.runnable[: len(self._internal)] = self._internal
        self.n_runnable = len(self._internal)

    def advance(self, *, budget: int = 0, target: int = -1) -> bool:
        """Run the virtual ranks until all block or finish; with ``budget``, at most that many
        nodes; with ``target``, only until that node has an end. True when nothing is left to run."""
        g = self.g
        self.n_runnable = advance(
            g.rank_ptr, g.kind, self.busy, g.gap, g.is_async, g.slot, g.slot_size, g.slot_nodes_ptr, g.slot_nodes,
            g.deps_ptr, g.deps, self.deps_lag, self.start, self.end, self.arrived, self.last_arrival, self.pc,
            self.clock, self.waiting_node, self.next_waiter, self.runnable, self.n_runnable, *self._hedging(),
            self.wake_wait, self.wake_extra, self.owed, budget, target,
        )  # fmt: skip
        return self.n_runnable == 0

    @property
    def idle(self) -> bool:
        """No virtual rank can run until an external rank does something."""
        return self.n_runnable == 0

    def _hedging(self) -> tuple:
        h = self.hedge
        return h.hedged, h.mu, h.sd, self.g.dur, self.real_last

    def done(self, rank: int) -> bool:
        return bool(self.pc[rank] >= self.g.rank_ptr[rank + 1])

    def next_node(self, rank: int) -> int:
        """Global row of the node an external rank is at."""
        return int(self.pc[rank])

    def arrive_external(self, rank: int, t_ns: int) -> None:
        """The external rank reached its current node at ``t_ns`` (starts it; arrives at a collective)."""
        i = self.next_node(rank)
        g = self.g
        if g.kind[i] == COMPUTE:
            self.start[i] = t_ns
            return
        self.n_runnable = _arrive(
            i, t_ns, True, self.busy, g.slot, g.slot_size, g.slot_nodes_ptr, g.slot_nodes, self.start, self.end,
            self.arrived, self.last_arrival, self.waiting_node, self.next_waiter, self.runnable, self.n_runnable,
            *self._hedging(),
        )  # fmt: skip

    def answer_rule(self, node: int) -> AnswerRule | None:
        """How an external rank's comm ``node`` will end, if every other member has arrived."""
        g, s = self.g, int(self.g.slot[node])
        if self.start[node] >= 0 or self.arrived[s] != g.slot_size[s] - 1:
            return None
        h = self.hedge
        if len(h.hedged) and h.hedged[s]:
            if h.mu[s] < 0.0:  # every member real: its own backend times it
                return None
            return AnswerRule(
                node, int(self.real_last[s]), int(self.last_arrival[s]), float(h.mu[s]), float(h.sd[s]), int(g.dur[node])
            )  # fmt: skip
        return AnswerRule(node, int(self.last_arrival[s]), 0, -1.0, 0.0, int(self.busy[node]))

    def finish_external(self, rank: int, t_ns: int) -> None:
        """The external rank's program moved past its current node at ``t_ns``."""
        i = self.next_node(rank)
        if self.g.kind[i] == COMPUTE:
            self.end[i] = t_ns  # dependencies are same-rank: nobody else waits on it
        self.clock[rank] = t_ns
        self.pc[rank] += 1

    def finish_external_run(self, rank: int, stop: int, start_ns: np.ndarray, end_ns: np.ndarray) -> None:
        """The external rank ran its compute nodes up to ``stop`` with these times (one call for many)."""
        i = self.next_node(rank)
        self.start[i:stop] = start_ns
        self.end[i:stop] = end_ns
        self.clock[rank] = end_ns[-1]
        self.pc[rank] = stop
