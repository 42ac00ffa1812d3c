"""Wall time of each iteration's top-level blocks, profiled or not: the input of the build's
per-phase profiler correction (``prism.graph.build.profiler_overhead``).

Kineto sees only the profiled iterations. The profiler's cost is closer to a constant per op
than to a share of each op's time, so it weighs on phases of many tiny ops (Adam's step, thousands of
ops an iteration) far more than on a few big matmuls, and one
unprofiled/profiled factor per role leaves the first several times too long and the second
short. Every ``annotate.mark`` opens through this timer, so each top-level block (forward and
backward of a microbatch, a posted transfer, a p2p wait, the gradient sync, the optimizer step)
is timed in every iteration for two ``time.time_ns()`` calls; ``own_phase_ns`` then takes the
process-group calls and the time prism held the program out of each, from the comm log, and cuts
the iteration as the build cuts its trace into templates (the glue before a block is the block's),
so that each phase's unprofiled/profiled ratio scales exactly what the template of that phase holds.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from prism.schemas.annotations import BLOCK_PHASES, GLUE, Mark, Phase, block_kind
from prism.schemas.comm_log import CommLog, HeldTime, PricedTime


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """One top-level block of an iteration on the wall clock of the comm log."""

    kind: str
    """``block_kind`` of its mark: 'fwd', 'send_fwd', 'optim', ..."""
    start_ns: int
    """``time.time_ns()`` as it opened."""
    end_ns: int
    """``time.time_ns()`` as it closed."""


class PhaseTimer:
    """Collects the spans of the outermost block marks opened on the thread that made it."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()
        self._depth = 0  # block marks open on the thread
        self._spans: list[BlockSpan] = []

    def opened(self, mark: Mark) -> int | None:
        """Called as ``mark`` opens: its start time if it is a top-level block, else None."""
        if mark.phase not in BLOCK_PHASES or threading.get_ident() != self._thread:
            return None
        self._depth += 1
        return time.time_ns() if self._depth == 1 else None

    def closed(self, mark: Mark, start_ns: int | None) -> None:
        """Called as ``mark`` closes, with what ``opened`` returned for it."""
        if mark.phase not in BLOCK_PHASES or threading.get_ident() != self._thread:
            return
        self._depth -= 1
        if start_ns is not None:
            end_ns = time.time_ns()
            self._spans.append(BlockSpan(block_kind(mark.phase, mark.dir), start_ns, end_ns))

    def take(self) -> list[BlockSpan]:
        """The spans closed since the last call (one iteration's, when called after each)."""
        spans, self._spans = self._spans, []
        return spans


def block_wall_ns(spans_by_iteration: Sequence[Sequence[BlockSpan]]) -> tuple[dict[str, int], ...]:
    """Each iteration's wall time in its top-level blocks by kind, the calls made inside them
    and any hold included: what a run without prism's process group can measure of itself."""
    phases = []
    for spans in spans_by_iteration:
        by_kind: dict[str, int] = defaultdict(int)
        for span in spans:
            by_kind[span.kind] += span.end_ns - span.start_ns
        phases.append(dict(by_kind))
    return tuple(phases)


WAITS = frozenset({Phase.P2P_WAIT.value})
"""Block kinds that hold no op of their own on CPU: a wait for the transfers posted before it.
The trace has nothing to cut there, so its time lands in the gap before the next block's first op."""


def own_phase_ns(
    spans_by_iteration: Sequence[Sequence[BlockSpan]], log: CommLog, own_iteration_ns: Sequence[int]
) -> tuple[dict[str, int], ...]:
    """Each iteration's own time by block kind, cut as the templates cut the trace: a block's
    wall time less the process-group calls the comm model prices (``PricedTime``: a transfer's
    post is the program's own) and the time prism held the program in it, together with the
    time since the block before it closed (the trace puts that glue in the gap before the
    block's first op) and the time of a wait just before it (``WAITS``: no op to carry it);
    ``GLUE``: the iteration's own time (``RankResult.own_iteration_ns``) before its first block
    and after its last."""
    calls, held = PricedTime(log), HeldTime(log)
    phases = []
    for spans, own_ns in zip(spans_by_iteration, own_iteration_ns, strict=True):
        by_kind: dict[str, int] = defaultdict(int)
        covered = 0  # the blocks' time with the glue led into them, calls in, holds out
        carried = carried_cover = 0  # a wait's, passed on to the block after it
        closed: int | None = None
        for span in sorted(spans, key=lambda s: s.start_ns):
            begin = span.start_ns if closed is None else closed
            wall = span.end_ns - begin
            own = wall - calls.within(begin, span.end_ns)
            cover = wall - held.within(begin, span.end_ns)
            if span.kind in WAITS:
                carried, carried_cover = carried + own, carried_cover + cover
            else:
                by_kind[span.kind] += own + carried
                covered += cover + carried_cover
                carried = carried_cover = 0
            closed = span.end_ns
        by_kind[GLUE] = own_ns - covered
        phases.append(dict(by_kind))
    return tuple(phases)
