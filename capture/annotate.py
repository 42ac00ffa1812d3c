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

Backward marks of a block come from two identity autograd nodes: one on the block's output,
whose backward runs first and opens the range, and one on its input, whose backward runs
after every op of the block and closes it. A block whose input needs no gradient (the
embedding) has its range closed when the enclosing ``backward`` context exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch
from torch.autograd.profiler import record_function

from prism.schemas.annotations import Direction, Mark, Part, Phase, format_mark


@contextlib.contextmanager
def mark(m: Mark) -> Iterator[None]:
    """Open a record_function named after ``m`` for the duration of the block."""
    with record_function(format_mark(m)):
        yield


def iteration(index: int) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.ITERATION, iter=index))


def forward(*, stage: int, mb: int, layer: int | None = None, part: Part | None = None) -> contextlib.AbstractContextManager[None]:
    return mark(Mark(phase=Phase.FORWARD, stage=stage, mb=mb, layer=layer, part=part))


@contextlib.contextmanager
def backward(*, stage: int, mb: int) -> Iterator[None]:
    """Backward of a microbatch; closes block ranges whose input needed no gradient."""
    depth = len(_open_ranges())
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

_local = threading.local()


def _open_ranges() -> list[record_function]:
    if not hasattr(_local, "ranges"):
        _local.ranges = []
    return _local.ranges


def _close_ranges_above(depth: int) -> None:
    ranges = _open_ranges()
    while len(ranges) > depth:
        ranges.pop().__exit__(None, None, None)


class _RangeSlot:
    """The backward range of one block, shared by its opening and closing autograd nodes."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.range: record_function | None = None

    def open(self) -> None:
        self.range = record_function(self.name)
        self.range.__enter__()
        _open_ranges().append(self.range)

    def close(self) -> None:
        ranges = _open_ranges()
        if self.range is not None and self.range in ranges:
            # Close anything opened inside this block too, so ranges stay properly nested.
            _close_ranges_above(ranges.index(self.range))
        self.range = None


class _OpenOnBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, slot: _RangeSlot) -> torch.Tensor:
        ctx.slot = slot
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.slot.open()
        return grad, None


class _CloseOnBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, slot: _RangeSlot) -> torch.Tensor:
        ctx.slot = slot
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.slot.close()
        return grad, None


def block(
    fn: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    *,
    stage: int,
    mb: int,
    layer: int | None = None,
    part: Part | None = None,
) -> torch.Tensor:
    """Run ``fn(x)`` marked as the forward of one block, and mark the block's backward too."""
    fields = {"stage": stage, "mb": mb, "layer": layer, "part": part}
    slot = _RangeSlot(format_mark(Mark(phase=Phase.BACKWARD, **fields)))
    if torch.is_grad_enabled() and x.requires_grad:
        x = _CloseOnBackward.apply(x, slot)
    with mark(Mark(phase=Phase.FORWARD, **fields)):
        y = fn(x)
    if torch.is_grad_enabled() and y.requires_grad:
        y = _OpenOnBackward.apply(y, slot)
    return y
