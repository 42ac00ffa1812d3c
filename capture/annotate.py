"""Marks that let prism cut a trace into blocks; any training program can emit them.

Each context manager opens a ``record_function`` whose name follows the grammar in
``prism.schemas.annotations``::

    from prism.capture import annotate

    with annotate.iteration(step):
        with annotate.forward(stage=s, mb=m):
            y = annotate.block(layer_fn, x, stage=s, mb=m, layer=l)   # marks fwd *and* bwd of layer l
        with annotate.backward(stage=s, mb=m):
            torch.autograd.backward(y, grad)
        with annotate.grad_sync():
            ...
        with annotate.optimizer():
            ...

Backward marks of a block come from gradient hooks: the one on the block's output fires
first and opens the range, the one on its input fires after every op of the block and closes
it. A block whose input needs no gradient (the embedding) has its range closed when the
enclosing ``backward`` context exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch
from torch.autograd.profiler import record_function

from prism.capture.phase_timer import PhaseTimer
from prism.schemas.annotations import Direction, Mark, Part, Phase, format_mark

BlockHook = Callable[[Mark], None]
_block_hook: BlockHook | None = None
_phase_timer: PhaseTimer | None = None


def set_block_hook(hook: BlockHook | None) -> None:
    """Call ``hook(mark)`` as each block opened by ``mark`` begins (inside its range); None: no hook.

    prism-replay uses it to make a real rank a straggler (``--delay``)."""
    global _block_hook
    _block_hook = hook


def set_phase_timer(timer: PhaseTimer | None) -> None:
    """Time every top-level block with ``timer`` (``prism.capture.phase_timer``); None: stop.

    The capture's rank process sets one, so that unprofiled iterations are timed by phase too."""
    global _phase_timer
    _phase_timer = timer


@contextlib.contextmanager
def mark(m: Mark) -> Iterator[None]:
    """Open a record_function named after ``m`` for the duration of the block."""
    with record_function(format_mark(m)):
        timer = _phase_timer
        started = timer.opened(m) if timer is not None else None
        try:
            if _block_hook is not None:
                _block_hook(m)
            yield
        finally:
            if timer is not None:
                timer.closed(m, started)


IterationHook = Callable[[bool], None]
"""Told ``True`` as a program's own iteration mark opens and ``False`` as it closes."""
_iteration_hook: IterationHook | None = None


def set_iteration_hook(hook: IterationHook | None) -> None:
    """Tell ``hook`` where the program's own ``iteration`` marks open and close (a program capture
    then cuts iterations at them instead of at optimizer steps); None: no hook."""
    global _iteration_hook
    _iteration_hook = hook


@contextlib.contextmanager
def iteration(index: int) -> Iterator[None]:
    """One training iteration of the program (a program capture cuts its iterations here)."""
    hook = _iteration_hook
    if hook is not None:
        hook(True)
    with mark(Mark(phase=Phase.ITERATION, iter=index)):
        yield
    if hook is not None:
        hook(False)  # outside the mark: the hook may end the program here


def forward(
    *, stage: int, mb: int, layer: int | None = None, part: Part | None = None
) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.FORWARD, stage=stage, mb=mb, layer=layer, part=part))


@contextlib.contextmanager
def backward(*, stage: int, mb: int) -> Iterator[None]:
    """Backward of a microbatch; closes block ranges whose input needed no gradient."""
    depth = len(_ranges)
    with mark(Mark(phase=Phase.BACKWARD, stage=stage, mb=mb)):
        try:
            yield
        finally:
            _close_ranges_above(depth)


def send(*, direction: Direction, stage: int, mb: int, peer: int) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.SEND, dir=direction, stage=stage, mb=mb, peer=peer))


def recv(*, direction: Direction, stage: int, mb: int, peer: int) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.RECV, dir=direction, stage=stage, mb=mb, peer=peer))


def p2p_wait(*, stage: int) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.P2P_WAIT, stage=stage))


def grad_sync(*, bucket: int | None = None) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.GRAD_SYNC, bucket=bucket))


def optimizer() -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.OPTIMIZER))


# -- forward + backward marks of one block ---------------------------------------------------

# Open backward ranges. One list per process rather than per thread: on CUDA the autograd
# engine runs a block's backward on a device thread, and the enclosing ``backward`` context
# (on the caller's thread) must still be able to close what a hook opened there.
_ranges: list[record_function] = []
_ranges_lock = threading.Lock()


def _open_ranges() -> list[record_function]:
    return _ranges


def _close_ranges_above(depth: int) -> None:
    with _ranges_lock:
        while len(_ranges) > depth:
            _ranges.pop().__exit__(None, None, None)


class _RangeSlot:
    """The backward range of one block."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.range: record_function | None = None

    def open(self) -> None:
        self.range = record_function(self.name)
        self.range.__enter__()
        with _ranges_lock:
            _ranges.append(self.range)

    def close(self) -> None:
        if self.range is not None and self.range in _ranges:
            # Close anything opened inside this block too, so ranges stay properly nested.
            _close_ranges_above(_ranges.index(self.range))
        self.range = None


class _Boundary:
    """The one gradient hook of a tensor between blocks.

    Layer l's output is layer l+1's input: when its gradient is ready, block l+1's backward
    is over and block l's begins, so closes must run before opens whatever order the hooks
    were registered in.
    """

    def __init__(self) -> None:
        self.closes: list[_RangeSlot] = []
        self.opens: list[_RangeSlot] = []

    def __call__(self, grad: torch.Tensor) -> None:
        for slot in self.closes:
            slot.close()
        for slot in self.opens:
            slot.open()

    @staticmethod
    def of(t: torch.Tensor) -> _Boundary:
        boundary = getattr(t, "_prism_boundary", None)
        if boundary is None:
            boundary = _Boundary()
            t.register_hook(boundary)
            t._prism_boundary = boundary
        return boundary


def block(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    *,
    stage: int,
    mb: int,
    layer: int | None = None,
    part: Part | None = None,
) -> torch.Tensor:
    """Run ``fn(x)`` marked as the forward of one block, and mark the block's backward too.

    The gradient hook of the output fires when backward reaches the block (it opens the
    range); the hook of the input fires once every op of the block has contributed to the
    input's gradient (it closes it). Hooks add no node to the graph, so in-place ops on the
    block's input or output work as without the mark.
    """
    fields = {"stage": stage, "mb": mb, "layer": layer, "part": part}
    slot = _RangeSlot(format_mark(Mark(phase=Phase.BACKWARD, **fields)))
    tracking = torch.is_grad_enabled()
    if tracking and x.requires_grad:
        _Boundary.of(x).closes.append(slot)
    with mark(Mark(phase=Phase.FORWARD, **fields)):
        y = fn(x)
    if tracking and y.requires_grad:
        _Boundary.of(y).opens.append(slot)
    return y
