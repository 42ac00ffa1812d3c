"""How a real rank's measured time between two events is spread over its compute nodes.

The co-simulation learns only when the program reached each call; the compute nodes before it
get the measured span split as the engine would have spent it (gaps, waits for earlier async
calls, durations; the gap before the call counts to the node before it), scaled to the
measured length. With the graph's own times this is the offline split exactly. One compiled
loop: it runs at every call of the program, where numpy's per-call cost on a dozen nodes
would be most of the replay's time in the program's thread.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def spread(i, stop, gap_after, clock, t, gap, busy, deps_ptr, deps, end, phase_code, phase_acc):  # fmt: skip
    """Start and end of nodes ``i..stop-1`` when the rank, at ``clock`` after node ``i - 1``,
    reaches ``stop`` at graph time ``t``; adds each node's time to ``phase_acc[phase_code[k]]``
    (``phase_code`` indexed from node ``i``). ``gap_after``: the gap before ``stop`` itself."""
    n = stop - i
    predicted = np.empty(n, np.float64)
    c = clock
    for k in range(n):
        node = i + k
        ready = c + gap[node]
        for j in range(deps_ptr[node], deps_ptr[node + 1]):
            ready = max(ready, end[deps[j]])
        predicted[k] = ready + busy[node] - c
        c = ready + busy[node]
    predicted[n - 1] += gap_after
    total = 0.0
    for k in range(n):
        total += predicted[k]
    span = max(t - clock, 0)
    starts, ends = np.empty(n, np.int64), np.empty(n, np.int64)
    share, previous = 0.0, clock
    for k in range(n):
        share += predicted[k] / total if total > 0 else 1.0 / n
        ends[k] = clock + np.int64(np.rint(share * span))
        starts[k] = previous
        phase_acc[phase_code[k]] += ends[k] - previous
        previous = ends[k]
    return starts, ends
