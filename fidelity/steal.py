"""CPU time the hypervisor gave another guest while a run measured ("steal" in ``/proc/stat``,
read by psutil). On a shared VM a run measured through a spell of steal is slower for reasons
no model of the program has: such a run is repeated, not averaged in.

``STEAL_LIMIT_PCT``: a run whose share of the machine's CPU time stolen exceeds it is run again,
up to ``STEAL_TRIES`` runs in all; the last one is kept whatever its steal, with the share it
saw, so that a record says how clean its runs were. Quiet spells of the project's 2-vCPU VM
steal 0.0-0.2 % (``psutil.cpu_times``); a neighbour taking the host's cores steals several percent.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")

STEAL_LIMIT_PCT = 2.0
"""Most of the machine's CPU time a kept run may have had stolen, in %."""
STEAL_TRIES = 3
"""Runs at most, the first included, before the last one is kept whatever its steal."""


@dataclass(frozen=True)
class Stolen:
    """What the hypervisor took during the run that was kept."""

    pct: float
    """Share of the machine's CPU time (all cores) stolen during the run, in %."""
    tries: int
    """Runs made to keep this one (1: the first was clean)."""


def stolen_pct(before, after) -> float:
    """The share of CPU time stolen between two ``psutil.cpu_times()`` readings, in %. Guest time
    is already inside user time on Linux and is not counted twice."""
    fields = [f for f in before._fields if f not in ("guest", "guest_nice")]
    total = sum(getattr(after, f) - getattr(before, f) for f in fields)
    steal = getattr(after, "steal", 0.0) - getattr(before, "steal", 0.0)
    return 100.0 * steal / total if total > 0 else 0.0


def run_unstolen(
    run: Callable[[], T],
    *,
    out: Path | None,
    limit_pct: float | None = STEAL_LIMIT_PCT,
    tries: int = STEAL_TRIES,
    say: Callable[[str], None] | None = None,
) -> tuple[T, Stolen]:
    """``run()``'s result and the steal it saw, ``run`` repeated while its steal exceeds
    ``limit_pct`` (None: never), at most ``tries`` times. ``out``: the folder ``run`` writes,
    removed before it runs again."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    for attempt in range(1, tries + 1):
        before = psutil.cpu_times()
        result = run()
        pct = stolen_pct(before, psutil.cpu_times())
        if limit_pct is None or pct <= limit_pct or attempt == tries:
            return result, Stolen(pct=pct, tries=attempt)
        if say is not None:
            say(
                f"{pct:.1f} % of the CPU time was stolen during the run (limit {limit_pct:g} %): running it again"
            )
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
    raise AssertionError("unreachable")
