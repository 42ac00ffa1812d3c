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
    with mark(Mark(phase=Phase.BACKWARD, stage=stage, mb=mb)), closing_block_ranges():
        yield


@contextlib.contextmanager
def closing_block_ranges() -> Iterator[None]:
    """Close, as the body ends, the block backward ranges it opened and no gradient hook closed
    (a block whose input needed no gradient)."""
    depth = len(_ranges)
    try:
        yield
    finally:
        _close_ranges_above(depth)


def marks_are_read() -> bool:
    """Whether something reads marks now: the profiler records, or a block hook is set. Marks a
    program does not open itself are opened only then, so that its untraced iterations run as
    the user's job does."""
    return _block_hook is not None or torch.autograd._profiler_enabled()


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


class BackwardRange:
    """The backward range of one block: mark ``m`` over the backward of the ops that took ``x``
    to ``y``, opened as ``y``'s gradient is ready (``begins_at(y)``, after the ops ran) and closed
    as ``x``'s is (``ends_at(x)``, before they ran: in-place ops may follow), or, where ``x``
    needs none, as the enclosing ``closing_block_ranges`` ends."""

    def __init__(self, m: Mark) -> None:
        self.mark = m
        self.range: record_function | None = None

    def ends_at(self, x: torch.Tensor | None) -> None:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            _Boundary.of(x).closes.append(self)

    def begins_at(self, y: torch.Tensor | None) -> None:
        if isinstance(y, torch.Tensor) and y.requires_grad:
            _Boundary.of(y).opens.append(self)

    def open(self) -> None:
        self.range = record_function(format_mark(self.mark))
        self.range.__enter__()
        with _ranges_lock:
            _ranges.append(self.range)
        if _block_hook is not None:  # a straggler's delay of this block's backward, inside its range
            _block_hook(self.mark)

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
        self.closes: list[BackwardRange] = []
        self.opens: list[BackwardRange] = []

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
    backward_range = BackwardRange(Mark(phase=Phase.BACKWARD, **fields))
    tracking = torch.is_grad_enabled()
    if tracking:
        backward_range.ends_at(x)
    with mark(Mark(phase=Phase.FORWARD, **fields)):
        y = fn(x)
    if tracking:
        backward_range.begins_at(y)
    return y
