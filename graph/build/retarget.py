"""What a target stage holds when it holds other layers than the captured rank of its role:
its parameters, their gradient buckets and its static memory, from the parameters the capture
recorded (``prism.schemas.held_parameters``). Knows no model: any program whose layer blocks
are alike gets it (the built-in GPT's named ``layers.<i>``, a program's found by its layer marks).

A stage holds the parameters its role's captured rank held before its first block (the
first stage's embeddings), one copy of a captured block's for each of its blocks, and those
after the last block (the last stage's head). Its static memory is what those parameters keep,
plus its gradient buckets where it has data-parallel peers, plus what the captured rank held
beyond them (on CUDA: what libraries keep in the allocator; nothing where only the parameters
were counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from prism.graph.build.templates import TemplateError
from prism.schemas.grad_buckets import Bucket, plan_buckets
from prism.schemas.held_parameters import HeldParameters


@dataclass(frozen=True, kw_only=True)
class StageHolding:
    """What every rank of one stage holds across iterations."""

    parameters: HeldParameters
    buckets: list[Bucket]
    """Its data-parallel gradient buckets, in sync order."""
    static_bytes: int
    """Bytes it keeps between iterations."""


def held_blocks(captured: HeldParameters) -> list[int]:
    """The layer blocks ``captured`` holds, in order. Refused where its blocks run more than once
    (a rank holding several pipeline stages, each numbering its blocks from 0: interleaved and
    V-shaped schedules), whose stages one layer stack cannot stand for."""
    in_blocks = [at for at in captured.layers if at >= 0]
    if any(b < a for a, b in zip(in_blocks, in_blocks[1:], strict=False)):
        raise TemplateError(
            "the captured rank holds its layer blocks in more than one run (several pipeline stages a rank, as "
            "interleaved and V-shaped schedules place them): its stages cannot hold other layers"
        )
    return sorted(set(in_blocks))


def _ordered(captured: HeldParameters, layers: range) -> list[tuple[int, int]]:
    """(captured parameter, layer) of each parameter of a stage of ``layers``, in order."""
    blocks = held_blocks(captured)
    if not blocks:
        raise TemplateError(
            "the captured rank holds no parameters in layer blocks: its stage cannot hold other layers"
        )
    if list(layers) == blocks:
        return list(enumerate(captured.layers))
    block = captured.in_layer(blocks[0])
    if any(
        [captured.numels[i] for i in captured.in_layer(b)] != [captured.numels[i] for i in block]
        for b in blocks
    ):
        raise TemplateError(
            "the captured layer blocks hold different parameters: a stage can only hold the layers captured"
        )
    first = captured.layers.index(blocks[0])
    last = len(captured.layers) - captured.layers[::-1].index(blocks[-1])
    if any(captured.layers[i] < 0 for i in range(first, last)):
        raise TemplateError(
            "the captured rank registers parameters between its layer blocks: cannot move its layers"
        )
    before, after = range(first), range(last, len(captured.numels))
    return (
        [(i, -1) for i in before] + [(i, layer) for layer in layers for i in block] + [(i, -1) for i in after]
    )


def parameter_sources(captured: HeldParameters, layers: range) -> list[int]:
    """For each parameter of a stage of ``layers`` whose role's captured rank held ``captured``,
    in order, the captured parameter it copies: those before the first block, one block's for
    each layer, those after the last."""
    return [i for i, _ in _ordered(captured, layers)]


def stage_parameters(captured: HeldParameters, layers: range) -> HeldParameters:
    """The parameters of a stage of ``layers`` whose role's captured rank held ``captured``."""
    order = _ordered(captured, layers)
    if order == list(enumerate(captured.layers)):
        return captured
    return HeldParameters(
        numels=tuple(captured.numels[i] for i, _ in order),
        layers=tuple(layer for _, layer in order),
        held_bytes=tuple(captured.held_bytes[i] for i, _ in order),
        itemsize=captured.itemsize,
        bucket_bytes=captured.bucket_bytes,
        first_bucket_bytes=captured.first_bucket_bytes,
        bucket_copies=captured.bucket_copies,
    )


def gradient_buckets(parameters: HeldParameters) -> list[Bucket]:
    """The data-parallel gradient buckets of ``parameters``."""
    return plan_buckets(
        [n * parameters.itemsize for n in parameters.numels],
        parameters.numels,
        parameters.bucket_bytes,
        parameters.first_bucket_bytes,
    )


def holding(parameters: HeldParameters, *, data_parallel: bool, beyond_bytes: int = 0) -> StageHolding:
    """A stage's holding: ``parameters``, their buckets (held where ``data_parallel``) and
    ``beyond_bytes`` held besides."""
    buckets = gradient_buckets(parameters)
    bucket_bytes = sum(b.numel for b in buckets) * parameters.itemsize if data_parallel else 0
    return StageHolding(
        parameters=parameters,
        buckets=buckets,
        static_bytes=sum(parameters.held_bytes) + bucket_bytes + beyond_bytes,
    )
