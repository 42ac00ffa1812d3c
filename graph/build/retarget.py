"""What a target stage holds when it holds other layers than the captured rank of its role:
its parameters, their gradient buckets and its static memory, from the parameters the capture
recorded (``prism.schemas.held_parameters``). Knows no model: any program whose layer blocks
are alike gets it (the built-in GPT's named ``layers.<i>``, a program's found by its layer marks).

A stage holds the parameters its role's captured rank held before its first block (the
first stage's embeddings), a captured block's for each of its blocks (the first and last as
captured, the inner ones from the captured inner ones), and those after the last block (the
last stage's head); a rank holding several stages (an interleaved schedule's) holds so in each. Its static memory is what those parameters keep,
plus its gradient buckets where it has data-parallel peers, plus what the captured rank held
beyond them (on CUDA: what libraries keep in the allocator; nothing where only the parameters
were counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

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


Stacks = range | Sequence[range]
"""The layers a stage holds at the target, one range for each of the rank's stages where it holds
several (an interleaved schedule's), in the order its parameters name them (``HeldParameters.stages``)."""


def held_blocks(captured: HeldParameters) -> list[list[int]]:
    """The layer blocks each stage ``captured`` holds, in order (one list where it holds one).
    Refused where one stage's blocks run more than once (several stages a rank recorded as one,
    each numbering its blocks from 0), which one layer stack cannot stand for."""
    out = []
    for chunk in captured.chunks():
        in_blocks = [captured.layers[i] for i in chunk if captured.layers[i] >= 0]
        if any(b < a for a, b in zip(in_blocks, in_blocks[1:], strict=False)):
            raise TemplateError(
                "the captured rank holds its layer blocks in more than one run (several pipeline stages a rank, as "
                "interleaved and V-shaped schedules place them, captured before prism recorded each parameter's "
                "stage): capture again to change their layers"
            )
        out.append(sorted(set(in_blocks)))
    return out


def _stacks(layers: Stacks) -> list[range]:
    return [layers] if isinstance(layers, range) else list(layers)


def _ordered(captured: HeldParameters, layers: Stacks) -> list[tuple[int, int]]:
    """(captured parameter, layer) of each parameter of a stage of ``layers``, in order."""
    stacks, chunks, blocks = _stacks(layers), captured.chunks(), held_blocks(captured)
    if len(stacks) != len(chunks):
        raise TemplateError(
            f"the captured rank holds {len(chunks)} pipeline stages and the target {len(stacks)}: "
            "each stage's layers are needed"
        )
    if [list(s) for s in stacks] == blocks:
        return list(enumerate(captured.layers))
    return [
        pair for args in zip(chunks, blocks, stacks, strict=True) for pair in _chunk_order(captured, *args)
    ]


def _chunk_order(
    captured: HeldParameters, chunk: list[int], blocks: list[int], layers: range
) -> list[tuple[int, int]]:
    """``_ordered`` of one stage's parameters (``chunk``: their positions; ``blocks``: its layers)."""
    if not blocks:
        raise TemplateError(
            "the captured rank holds no parameters in layer blocks: its stage cannot hold other layers"
        )
    of = [captured.layers[i] for i in chunk]
    in_block = {b: [i for i in chunk if captured.layers[i] == b] for b in blocks}
    sizes = {tuple(captured.numels[i] for i in members) for members in in_block.values()}
    if len(sizes) > 1:
        raise TemplateError(
            "the captured layer blocks hold different parameters: a stage can only hold the layers captured"
        )
    first = of.index(blocks[0])
    last = len(of) - of[::-1].index(blocks[-1])
    if any(of[i] < 0 for i in range(first, last)):
        raise TemplateError(
            "the captured rank registers parameters between its layer blocks: cannot move its layers"
        )
    copies = [in_block[blocks[_copied(n, len(layers), len(blocks))]] for n in range(len(layers))]
    return (
        [(i, -1) for i in chunk[:first]]
        + [(i, layer) for layer, block in zip(layers, copies, strict=True) for i in block]
        + [(i, -1) for i in chunk[last:]]
    )


def _copied(layer: int, layers: int, captured: int) -> int:
    """The captured block (its place in the stage) that the stage's ``layer``-th of ``layers``
    copies: the first and the last as captured (a loop over the parameters begins and ends in
    them, and what it makes once or drops once is theirs), the inner ones the captured inner
    ones in turn, the last of them repeated."""
    if layer == 0:
        return 0
    if layer == layers - 1:
        return captured - 1
    return max(min(layer, captured - 2), 0)


def parameter_sources(captured: HeldParameters, layers: Stacks) -> list[int]:
    """For each parameter of a stage of ``layers`` whose role's captured rank held ``captured``,
    in order, the captured parameter it copies: each of its stages' parameters before the first
    block, one block's for each layer, those after the last."""
    return [i for i, _ in _ordered(captured, layers)]


def stage_parameters(captured: HeldParameters, layers: Stacks) -> HeldParameters:
    """The parameters of a stage of ``layers`` whose role's captured rank held ``captured``."""
    order = _ordered(captured, layers)
    if order == list(enumerate(captured.layers)):
        return captured
    return replace(
        captured,
        numels=tuple(captured.numels[i] for i, _ in order),
        layers=tuple(layer for _, layer in order),
        held_bytes=tuple(captured.held_bytes[i] for i, _ in order),
        stages=tuple(captured.stages[i] for i, _ in order) if captured.stages else (),
    )


def first_layer(
    captured_first: int, blocks: int, *, captured_stage: int, stage: int, pp: int, per_stage: int
) -> int:
    """The number of a target stage's first layer, where the captured rank's stage (or one of its
    stages) began at ``captured_first`` with ``blocks`` layers: from 0 in each stage as captured,
    or across the stack (``captured_first`` a multiple of ``blocks``: the ``k``-th stage of the
    whole model), the stage ``stage`` holds in its place. With several stages a rank that is
    ``k + (stage - captured_stage)`` for a looped schedule (stages ``r``, ``r + pp``, ...) and
    ``k - (stage - captured_stage)`` for a V-shaped one's second (``2 pp - 1 - r``)."""
    if not captured_first or captured_first % blocks:
        return captured_first
    k = captured_first // blocks
    if stage == captured_stage:
        return k * per_stage
    if (k - captured_stage) % pp == 0:
        return (k + stage - captured_stage) * per_stage
    if k == 2 * pp - 1 - captured_stage:
        return (k - stage + captured_stage) * per_stage
    raise TemplateError(
        f"the captured rank of stage {captured_stage} holds the model's stage {k}: which stage rank {stage} holds "
        "in its place is not known; capture every pipeline stage (--roles pipeline)"
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
