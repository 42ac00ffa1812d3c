"""Which iterations of a captured or replayed run are which.

A run does ``warmup`` unprofiled iterations, then the profiled ones. Of the warm-up, the first
runs cold (allocator, caches, lazy init) and the last one is the profiler's own warm-up step, so
the clean unprofiled iterations are ``[1 : warmup - 1]``: a run needs ``warmup >= 3`` to have one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

MIN_WARMUP = 3
"""Warm-up iterations a run needs for one clean unprofiled iteration."""
STEADY_CLEAN = 8
"""Clean unprofiled iterations for a steady estimate of how much they vary: a coefficient of
variation from ``n`` samples has a standard error of about ``cv / sqrt(2 (n - 1))``, half of it
at 3, a fifth at 8."""
DEFAULT_WARMUP = STEADY_CLEAN + 2
"""The commands' default warm-up: ``STEADY_CLEAN`` clean iterations, with the cold first and the
profiler's warm-up step around them."""

MIN_PROGRAM_PROFILED = 2
"""Profiled iterations a program's run needs: the profiler records no free of a block allocated
before it started, so the first profiled iteration's memory runs high by what it frees of the
iteration before (a program's gradients, dropped by ``zero_grad``). A program's graph reads its
memory from the profiled iterations after the first, and its replay measures the same ones."""
PROGRAM_PROFILED_WHY = (
    f"--iterations must be at least {MIN_PROGRAM_PROFILED} for a program: its memory is read from "
    "the profiled iterations after the first (the profiler sees no free of a block allocated "
    "before it started)"
)


def clean_unprofiled(iterations: Sequence[T], warmup: int) -> tuple[T, ...]:
    """The entries (wall times, or anything kept per iteration) of the warm-up iterations that
    ran neither cold nor under the profiler."""
    return tuple(iterations[1 : max(warmup - 1, 1)])


def call_signature(call) -> tuple:
    """What a logged call did, as iterations are compared by it: op, group label, bytes, peer."""
    return (call.op, call.label, call.bytes, call.peer)


def calls_within(calls: Sequence, windows: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """How many of the logged ``calls`` began in each ``(start, end)`` window."""
    enters = sorted(c.enter_ns for c in calls)
    return tuple(
        bisect.bisect_left(enters, end) - bisect.bisect_left(enters, start) for start, end in windows
    )


def steady_from(windows: Sequence[tuple[int, int]], calls: Sequence) -> int:
    """The first iteration from which every iteration made the same process-group calls as the
    last one (op, group, bytes, peer of the calls that began in its ``(start, end)`` window):
    before it, a program's set-up and one-time calls (DDP rebuilds its buckets in iteration 1)."""
    signatures = [
        tuple(call_signature(c) for c in calls if start <= c.enter_ns < end) for start, end in windows
    ]
    if not signatures:
        return 0
    first = len(signatures) - 1
    while first > 0 and signatures[first - 1] == signatures[-1]:
        first -= 1
    return first


CUT_HINT = (
    "prism ends an iteration at each outermost optimizer step; a program that steps several optimizers one "
    "after another can step a torch.profiler once a step (prism then cuts there) or mark its steps with "
    "prism.capture.annotate.iteration"
)
"""What a user can do about iterations that are not their program's steps."""


def _listed(indices: Sequence[int]) -> str:
    return ", ".join(map(str, indices[:6])) + (", ..." if len(indices) > 6 else "")


SHORTEST_SHARE = 0.05
"""An iteration below this share of the longest one run alike (both clean, or both profiled) and
of the other kind's longest is not a training step: no noise makes a program's step 20 times
faster, while cutting at something other than the step (an inner optimizer's step, a second
optimizer stepped after the first) gives iterations of near-zero length beside whole ones in
both kinds. Noise can make a short step 20 times slower (a stall of tens of milliseconds in a
2 ms step), in one kind: the other kind's longest tells that long one from a cut."""


def implausible_iterations(iteration_ns: Sequence[int], warmup: int, calls: Sequence[int] = ()) -> str | None:
    """Why a run's iterations cannot be the program's training steps, or None.

    Compares the clean unprofiled iterations' times with each other and the profiled ones' with
    each other (the profiler slows a step several times on CPU), a short one also with the other
    kind's longest (``SHORTEST_SHARE``), and with ``calls`` (process-group
    calls begun in each iteration) whether some iterations made calls and others none, as a
    distributed training step always makes one. The first iteration (set-up, cold) is left out."""
    silent = [i for i, n in enumerate(calls) if i > 0 and n == 0]
    calling = [i for i, n in enumerate(calls) if i > 0 and n > 0]
    if silent and calling:
        made = sorted({calls[i] for i in calling})
        counts = str(made[0]) if len(made) == 1 else f"{made[0]}-{made[-1]}"
        return (
            f"iterations {_listed(silent)} made no process-group call while {_listed(calling)} made "
            f"{counts}: they are no training steps"
        )
    kinds = {"unprofiled": clean_unprofiled(iteration_ns, warmup), "profiled": tuple(iteration_ns[warmup:])}
    for kind, times in kinds.items():
        if len(times) < 2:
            continue
        (other,) = (t for k, t in kinds.items() if k != kind)
        shortest, longest = min(times), max(times)
        whole = min(longest, max(other)) if other else longest
        if shortest < SHORTEST_SHARE * whole:
            listed = ", ".join(f"{ns / 1e6:.3g}" for ns in times[:8])
            return (
                f"its {kind} iterations took {listed}{', ...' if len(times) > 8 else ''} ms: one of "
                f"{shortest / 1e6:.3g} ms beside one of {longest / 1e6:.3g} ms is no training step"
            )
    return None
