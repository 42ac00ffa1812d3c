"""A program's optimizer steps as the program means them: the outermost ``Optimizer.step`` calls.

torch runs its global step hooks (``register_optimizer_step_pre_hook`` / ``_post_hook``) on every
``Optimizer.step``, also on one that another optimizer's step makes: a container optimizer that is
itself an ``Optimizer`` and steps inner ones (torchtitan's ``OptimizersContainer``,
``ZeroRedundancyOptimizer``, a wrapper that steps a base optimizer) runs them once for itself and
once for each inner optimizer. The program made one step. ``register_outer_step_hooks`` calls its
hooks on the outermost step of each thread alone, so that every consumer of steps (iterations,
phase marks, the real runs' timer) cuts a program where its training step ends.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

StepHook = Callable[[torch.optim.Optimizer, object, object], None]
"""``(optimizer, args, kwargs)``, as torch's global step hooks are called."""


class _OpenSteps(threading.local):
    def __init__(self) -> None:
        self.depths: list[int] = []  # the stack depth of each optimizer step open on this thread


def _stack_depth() -> int:
    """Frames below torch's step wrapper, which called the hook that calls this."""
    frame, depth = sys._getframe(2), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


class OuterStepHooks:
    """The handles of ``register_outer_step_hooks``: ``remove()`` takes both hooks off."""

    def __init__(self, handles: list[RemovableHandle]) -> None:
        self._handles = handles

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def register_outer_step_hooks(*, pre: StepHook | None = None, post: StepHook | None = None) -> OuterStepHooks:
    """Call ``pre`` before and ``post`` after every outermost optimizer step (hooks registered
    earlier run first, as torch's own do). ``post`` may raise (to stop the program): the step is
    counted closed before it runs."""
    open_steps = _OpenSteps()

    def begins(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        depth, depths = _stack_depth(), open_steps.depths
        # A step that raised never ran its post hooks: one open at this depth or deeper has ended.
        while depths and depths[-1] >= depth:
            depths.pop()
        depths.append(depth)
        if len(depths) == 1 and pre is not None:
            pre(optimizer, args, kwargs)

    def ends(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        depths = open_steps.depths
        if depths:
            depths.pop()
        if not depths and post is not None:
            post(optimizer, args, kwargs)

    return OuterStepHooks([register_optimizer_step_pre_hook(begins), register_optimizer_step_post_hook(ends)])
