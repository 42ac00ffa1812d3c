"""Which cores the replayed ranks and the co-simulation run on.

The launcher's thread runs the co-simulation beside the program (``prism.replay.coordinator``).
Where the machine has a core to spare, each real rank's process is held to cores of its own
(``threads`` of them) and the launcher to the rest, so that the engine's work never lands on
the program's core and the scheduler never moves the program to another core mid-iteration,
where its caches are cold. Where there are too few cores, or the platform cannot pin (no
``os.sched_setaffinity``), nothing is pinned and the scheduler places both.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class CorePlan:
    """Cores of each real rank run at once, in launch order, and of the launcher."""

    ranks: tuple[frozenset[int], ...]
    launcher: frozenset[int]

    def to_dict(self) -> dict:
        return {"ranks": [sorted(c) for c in self.ranks], "launcher": sorted(self.launcher)}


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def plan_cores(ranks_at_once: int, threads: int, available: set[int] | None = None) -> CorePlan | None:
    """Cores for ``ranks_at_once`` rank processes of ``threads`` threads each and the launcher,
    out of ``available`` (default: the cores this process may run on); None where they do not
    fit with a core left for the launcher, or where this platform cannot pin."""
    if available is None:
        if not can_pin():
            return None
        available = os.sched_getaffinity(0)
    cores = sorted(available)
    need = ranks_at_once * threads
    if ranks_at_once < 1 or threads < 1 or len(cores) <= need:
        return None
    ranks = tuple(frozenset(cores[i * threads : (i + 1) * threads]) for i in range(ranks_at_once))
    return CorePlan(ranks=ranks, launcher=frozenset(cores[need:]))


@contextlib.contextmanager
def launcher_on(cores: frozenset[int] | None) -> Iterator[None]:
    """Hold the calling thread, and the threads it starts meanwhile (they inherit its cores), to
    ``cores``; back to where it could run before on exit. Nothing where ``cores`` is None."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
