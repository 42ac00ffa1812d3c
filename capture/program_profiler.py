"""A program's own ``torch.profiler`` during a capture: its steps end iterations; prism records.

Kineto records one session per process and the capture is already recording, so a program that
starts a profiler of its own (torchtitan and Hugging Face's Trainer do when asked to) would
collide with it. While a program is captured, ``torch.profiler.profile`` is this stand-in: it
records nothing itself, entering it hands the cutting of iterations from optimizer steps to its
``step()`` calls (the program's own iteration boundary), and its ``on_trace_ready`` handler is
never called: the capture's traces are the record.
"""

from __future__ import annotations

import torch.profiler
from torch.autograd.profiler_util import EventList

from prism.capture.step_iterations import StepIterations

_steps: StepIterations | None = None


class ProgramProfiler:
    """Stands in for ``torch.profiler.profile`` (any arguments are accepted and ignored)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.step_num = 0

    def start(self) -> None:
        if _steps is not None:
            _steps.profiler_started()

    def stop(self) -> None:
        pass

    def __enter__(self) -> ProgramProfiler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step(self) -> None:
        self.step_num += 1
        if _steps is not None:
            _steps.profiler_step()

    def export_chrome_trace(self, path: str) -> None:
        """Nothing to export: the capture directory holds the traces."""

    def key_averages(self, *args: object, **kwargs: object) -> EventList:
        return EventList()

    def events(self) -> EventList:
        return EventList()


def install(steps: StepIterations) -> None:
    """Make ``torch.profiler.profile`` the stand-in, telling ``steps`` of its starts and steps."""
    global _steps
    _steps = steps
    torch.profiler.profile = ProgramProfiler
    torch.profiler.profiler.profile = ProgramProfiler
