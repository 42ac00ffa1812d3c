"""The discrete-event core of the simulation: start and end of every node of every rank.

Semantics (one stream per rank; durations from the graph):

- A rank runs its nodes in program order. Node ``n`` may start at
  ``ready = max(clock + gap_ns[n], end of every node in deps[n])``, where ``clock`` is when the
  program reached it: the end of the previous node, or its *start* if that node is asynchronous.
- compute: ``end = start + dur``.
- collective: every member arrives at its ``start``; the operation runs from the last arrival
  for ``dur`` (the cost model's time), so all members share ``end = max(arrivals) + dur``.
  A synchronous call blocks its rank until ``end``; an asynchronous one returns at once and a
  later node waits for it through ``deps``.
- send / recv: a rendezvous, as gloo and NCCL transfers of activations are: the transfer runs
  from the later of the two posts for ``dur``; both nodes end together.

Link contention between concurrent operations is not modelled, so every end time is a pure
function of the dependencies: ranks are advanced until they block, in any order, and the
result does not depend on that order.
"""

from __future__ import annotations

import numba
import numpy as np

COMPUTE, COLLECTIVE, SEND, RECV = 0, 1, 2, 3


@numba.njit(cache=True)
def _complete(slot, t_end, slot_nodes_ptr, slot_nodes, end, waiting_rank, waiting_node, runnable, n_runnable):
    """Set the end of every node of a finished collective/transfer and wake ranks waiting on them."""
    for j in range(slot_nodes_ptr[slot], slot_nodes_ptr[slot + 1]):
        node = slot_nodes[j]
        end[node] = t_end
        r = waiting_node[node]
        if r >= 0:
            waiting_node[node] = -1
            runnable[n_runnable] = r
            n_runnable += 1
            waiting_rank[r] = -1
    return n_runnable


@numba.njit(cache=True)
def run(
    rank_ptr, kind, dur, gap, is_async, slot, slot_size, slot_nodes_ptr, slot_nodes,
    deps_ptr, deps, start_clock,
):  # fmt: skip
    """Start and end of every node; ranks that could not finish (a deadlock) have pc < their end.

    ``slot`` maps collective/send/recv nodes to a dense instance id (-1 for compute);
    ``slot_nodes`` lists every node of an instance; ``start_clock`` is each rank's time 0.
    """
    n_ranks = len(rank_ptr) - 1
    n = len(kind)
    start = np.full(n, -1, np.int64)
    end = np.full(n, -1, np.int64)
    arrived = np.zeros(len(slot_size), np.int64)
    last_arrival = np.zeros(len(slot_size), np.int64)
    pc = rank_ptr[:-1].copy()
    clock = start_clock.copy()
    waiting_rank = np.full(n_ranks, -1, np.int64)  # node a blocked rank waits for
    waiting_node = np.full(n, -1, np.int64)  # rank blocked on a node
    runnable = np.empty(n_ranks, np.int64)  # a rank is queued only while not blocked: once at most
    n_runnable = 0
    for r in range(n_ranks):
        runnable[n_runnable] = r
        n_runnable += 1
    while n_runnable > 0:
        n_runnable -= 1
        r = runnable[n_runnable]
        while pc[r] < rank_ptr[r + 1]:
            i = pc[r]
            if start[i] >= 0:  # resumed after blocking on this synchronous call
                clock[r] = end[i]
                pc[r] += 1
                continue
            ready = clock[r] + gap[i]
            blocked = -1
            for j in range(deps_ptr[i], deps_ptr[i + 1]):
                d = deps[j]
                if end[d] < 0:
                    blocked = d
                    break
                ready = max(ready, end[d])
            if blocked >= 0:
                waiting_node[blocked] = r
                waiting_rank[r] = blocked
                break
            start[i] = ready
            if kind[i] == COMPUTE:
                end[i] = ready + dur[i]
                clock[r] = end[i]
                pc[r] += 1
                continue
            s = slot[i]
            arrived[s] += 1
            last_arrival[s] = max(last_arrival[s], ready)
            if arrived[s] == slot_size[s]:
                n_runnable = _complete(
                    s, last_arrival[s] + dur[i], slot_nodes_ptr, slot_nodes, end, waiting_rank, waiting_node,
                    runnable, n_runnable,
                )  # fmt: skip
            if is_async[i]:
                clock[r] = ready
                pc[r] += 1
            elif end[i] >= 0:
                clock[r] = end[i]
                pc[r] += 1
            else:
                waiting_node[i] = r
                waiting_rank[r] = i
                break
    return start, end, pc
