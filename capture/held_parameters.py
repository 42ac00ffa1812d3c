"""Read from a model and its optimizer what each parameter keeps between iterations
(``prism.schemas.held_parameters``): the graph builder's basis for the static memory and the
gradient buckets of a stage the capture did not run, or of a program's stage at another layer
count.

A sharded parameter (a DTensor: FSDP2's, tensor parallel's) counts its local shard, its
gradient and optimizer state theirs: what this rank holds."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from prism.capture.program_layers import layer_blocks
from prism.schemas.held_parameters import HeldParameters

LAYER_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.")
"""A parameter of layer block ``i`` has ``layers.<i>.`` in its name, as the blocks of the
built-in GPT, torchtitan's and Hugging Face's decoders are named (global indices in each stage)."""


def held_parameters(model: nn.Module, optimizer: torch.optim.Optimizer, bucket_bytes: int) -> HeldParameters:
    """``model``'s parameters in registration order with what each holds now: itself, its
    gradient and every tensor of its ``optimizer`` state. Read after an optimizer step, when the
    state exists."""
    named = list(model.named_parameters())
    return _held(
        [(p, int(m.group(1)) if (m := LAYER_NAME.search(name)) else -1) for name, p in named],
        [optimizer],
        bucket_bytes,
    )


def program_parameters(
    roots: Iterable[nn.Module], optimizers: Iterable[torch.optim.Optimizer]
) -> HeldParameters:
    """A program's parameters under its ``roots`` (``prism.capture.program_phases``), in
    registration order, each in the layer block the layer marks give it
    (``prism.capture.program_layers``; -1 outside every block) and, where there are several
    roots, the root's index as its stage, with what it holds now. Its
    gradient buckets: a DistributedDataParallel root's cap, 0 where none buckets them."""
    roots = list(roots)
    in_layer = {
        id(p): index for root in roots for index, block in layer_blocks(root) for p in block.parameters()
    }
    seen: set[int] = set()
    parameters, stages = [], []
    for at, root in enumerate(roots):
        for p in root.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                parameters.append((p, in_layer.get(id(p), -1)))
                stages.append(at)
    ddp = [r for r in roots if isinstance(r, DistributedDataParallel)]
    held = _held(parameters, list(optimizers), max((int(r.bucket_bytes_cap) for r in ddp), default=0))
    if len(roots) > 1:
        held = replace(held, stages=tuple(stages))
    if not ddp:
        return held
    return replace(
        held,
        first_bucket_bytes=min(_first_bucket_bytes(r) for r in ddp),
        bucket_copies=any(not r.gradient_as_bucket_view for r in ddp),
    )


def _first_bucket_bytes(module: DistributedDataParallel) -> int:
    """The cap of the first bucket DDP fills: its own where it records one, else torch's default
    (1 MiB; every DDP before the cap was configurable used it)."""
    config = getattr(module, "_bucket_config", None)
    return int(getattr(config, "first_bucket_bytes_cap", dist._DEFAULT_FIRST_BUCKET_BYTES))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _held(
    parameters: list[tuple[torch.Tensor, int]], optimizers: list[torch.optim.Optimizer], bucket_bytes: int
) -> HeldParameters:
    """Each of ``parameters`` (with its layer) as it is held now: itself, its gradient and its
    state in any of ``optimizers``."""
    numels, layers, held = [], [], []
    itemsize = 0
    for p, layer in parameters:
        state = next((opt.state[p] for opt in optimizers if p in opt.state), {})
        tensors = [
            p,
            *([p.grad] if p.grad is not None else []),
            *(v for v in state.values() if torch.is_tensor(v)),
        ]
        tensors = [_local(t) for t in tensors]
        numels.append(max(1, _local(p).numel()))
        layers.append(layer)
        held.append(sum(t.numel() * t.element_size() for t in tensors))
        itemsize = itemsize or _local(p.grad if p.grad is not None else p).element_size()
    return HeldParameters(
        numels=tuple(numels), layers=tuple(layers), held_bytes=tuple(held), itemsize=itemsize or 1,
        bucket_bytes=bucket_bytes,
    )  # fmt: skip
