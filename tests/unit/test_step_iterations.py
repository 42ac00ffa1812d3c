"""A program's iterations as the optimizer-step hook cuts them: the wall time it reports spans
the same instants the completion clock is told, so that the clock's hold at an iteration's start
(a replay's co-simulation catching up) is in the wall time, and a time corrected by the clock
can never exceed it."""

from __future__ import annotations

import time

import torch

from prism.capture.step_iterations import StepIterations
from prism.peers.clock import ImmediateClock


class HoldingClock(ImmediateClock):
    """Holds the program at each iteration's start, as a co-simulation that is behind does."""

    def __init__(self, hold_ns: int) -> None:
        self.hold_ns = hold_ns
        self.started: list[int] = []
        self.done: list[int] = []

    def iteration_started(self, wall_ns: int) -> None:
        self.started.append(wall_ns)
        until = time.perf_counter_ns() + self.hold_ns
        while time.perf_counter_ns() < until:  # the program's thread is held, as by the engine
            pass

    def iteration_done(self, wall_ns: int) -> None:
        self.done.append(wall_ns)


class Steps:
    def step(self) -> None:
        pass


def test_the_clocks_hold_at_an_iterations_start_is_in_its_wall_time() -> None:
    hold_ns = 20_000_000
    clock = HoldingClock(hold_ns)
    hook = StepIterations(
        rank=0, total=3, profiled_from=3, stop_after_last=False, profiler=Steps(), clock=clock, cuda=False
    )  # fmt: skip
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    hook.start()
    for _ in range(3):
        hook(optimizer, (), {})
    timings = hook.timings
    assert len(timings.iteration_ns) == 3 and len(clock.done) == 3
    for elapsed, (began, ended), start, done in zip(
        timings.iteration_ns, timings.windows, clock.started, clock.done, strict=True
    ):
        assert elapsed >= hold_ns
        assert (began, ended) == (start, done)
        # The clock's span (time.time_ns) and the wall time (perf_counter_ns) are read together.
        assert abs((done - start) - elapsed) < 1_000_000
