"""A scripted program: a rank's graph nodes played against its replay clock on a fake wall clock.

It computes for the graph's durations (times a slowdown), makes each call of the graph at that
moment and waits for its completion, as a real program would, but in no time of its own: the
co-simulation's answers are all that moves. The clock's tests use it to check the co-simulation
against the offline simulation exactly, and ``benchmarks/cosim_cost.py`` to time the
co-simulation's own work.
"""

from __future__ import annotations

import threading

from prism.graph.sim.engine import COLLECTIVE, COMPUTE
from prism.graph.sim.simulate import SimGraph
from prism.peers.clock import PendingCall
from prism.replay.graph_clock import GraphClock

ORIGIN_NS = 1_000_000_000
NAMED_TIMEOUT_S = 10.0
"""How long a read of a completion not yet named waits before it fails (a hung co-simulation)."""


class FakeWall:
    """Wall time (ns) that moves only when the script moves it."""

    def __init__(self) -> None:
        self.now = ORIGIN_NS

    def __call__(self) -> int:
        return self.now


class Completions(dict):
    """Completion wall times by node; reading one not named yet waits for it, as a program's
    ``wait()`` does (the co-simulation's worker thread may name it)."""

    def __init__(self) -> None:
        super().__init__()
        self._named = threading.Condition()

    def __setitem__(self, node: int, at: int) -> None:
        with self._named:
            super().__setitem__(node, at)
            self._named.notify_all()

    def __missing__(self, node: int) -> int:
        with self._named:
            if not self._named.wait_for(lambda: dict.__contains__(self, node), timeout=NAMED_TIMEOUT_S):
                raise KeyError(node)
            return dict.__getitem__(self, node)


def play(
    clock: GraphClock,
    wall: FakeWall,
    g: SimGraph,
    *,
    iterations: int,
    slowdown: float = 1.0,
    bytes_off: int = 0,
) -> list[dict[int, int]]:
    """Run the real rank's program (graph ``g``) ``iterations`` times; per iteration, the wall
    time each of its calls completed. ``bytes_off`` is added to every call's size (a program
    that diverges from the graph)."""
    rank, program = clock.rank, clock.program
    first, last = int(g.rank_ptr[rank]), int(g.rank_ptr[rank + 1])
    done: list[dict[int, int]] = []
    for _ in range(iterations):
        clock.iteration_started(wall.now)
        completed = Completions()
        for node in range(first, last):
            wall.now += int(g.gap[node])
            if g.kind[node] == COMPUTE:
                deps = g.deps[g.deps_ptr[node] : g.deps_ptr[node + 1]]
                wall.now = max([wall.now, *(completed[d] for d in deps)]) + round(g.dur[node] * slowdown)
                continue
            i = node - first
            call = PendingCall(
                op=str(program.name[i]), group="0", label=str(program.label[i]), group_size=2, gseq=0,
                bytes=int(program.bytes[i]) + bytes_off, peer=None if g.kind[node] == COLLECTIVE else int(program.peer[i]),
                enter_ns=wall.now, async_op=bool(g.is_async[node]),
            )  # fmt: skip
            clock.submit(
                call,
                lambda at, node=node, entered=wall.now, into=completed: into.__setitem__(node, at or entered),
            )
            if not g.is_async[node]:
                wall.now = completed[node]
        clock.iteration_done(wall.now)
        done.append(dict(completed))
    return done
