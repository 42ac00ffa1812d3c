"""Read from a model and its optimizer what each parameter keeps between iterations
(``prism.schemas.held_parameters``): the graph builder's basis for the static memory and the
gradient buckets of a stage the capture did not run."""

from __future__ import annotations

import re

import torch
from torch import nn

from prism.schemas.held_parameters import HeldParameters

LAYER_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.")
"""A parameter of layer block ``i`` has ``layers.<i>.`` in its name, as the blocks of the
built-in GPT, torchtitan's and Hugging Face's decoders are named (global indices in each stage)."""


def held_parameters(model: nn.Module, optimizer: torch.optim.Optimizer, bucket_bytes: int) -> HeldParameters:
    """``model``'s parameters in registration order with what each holds now: itself, its
    gradient and every tensor of its ``optimizer`` state. Read after an optimizer step, when the
    state exists."""
    numels, layers, held = [], [], []
    itemsize = 0
    for name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        tensors = [
            p,
            *([p.grad] if p.grad is not None else []),
            *(v for v in state.values() if torch.is_tensor(v)),
        ]
        numels.append(p.numel())
        match = LAYER_NAME.search(name)
        layers.append(int(match.group(1)) if match else -1)
        held.append(sum(t.numel() * t.element_size() for t in tensors))
        itemsize = itemsize or (p.grad if p.grad is not None else p).element_size()
    return HeldParameters(
        numels=tuple(numels), layers=tuple(layers), held_bytes=tuple(held), itemsize=itemsize or 1,
        bucket_bytes=bucket_bytes,
    )  # fmt: skip
