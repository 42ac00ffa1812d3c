"""Parameters one rank of the GPT workload holds, and how they are packed into DP gradient buckets.

Declared here (pure Python) because the workload builds exactly these tensors and the graph
builder must know the bucket sizes of a target layout it never ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prism.schemas.workload import GPTConfig

MIB = 1 << 20


def _layer_shapes(cfg: GPTConfig, layer: int) -> list[tuple[str, tuple[int, ...]]]:
    h, f, tp = cfg.hidden, cfg.ffn, cfg.tp
    p = f"layers.{layer}"
    return [
        (f"{p}.norm1.weight", (h,)),
        (f"{p}.norm1.bias", (h,)),
        (f"{p}.attn.qkv.weight", (3 * h // tp, h)),  # column-parallel
        (f"{p}.attn.qkv.bias", (3 * h // tp,)),
        (f"{p}.attn.proj.weight", (h, h // tp)),  # row-parallel; its bias is replicated
        (f"{p}.attn.proj.bias", (h,)),
        (f"{p}.norm2.weight", (h,)),
        (f"{p}.norm2.bias", (h,)),
        (f"{p}.mlp.fc1.weight", (f // tp, h)),
        (f"{p}.mlp.fc1.bias", (f // tp,)),
        (f"{p}.mlp.fc2.weight", (h, f // tp)),
        (f"{p}.mlp.fc2.bias", (h,)),
    ]


def stage_parameter_shapes(cfg: GPTConfig, stage: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter a rank of ``stage`` holds, in registration order."""
    h, tp = cfg.hidden, cfg.tp
    shapes: list[tuple[str, tuple[int, ...]]] = []
    if stage == 0:
        shapes += [("embed.word.weight", (cfg.vocab // tp, h)), ("embed.position.weight", (cfg.seq_len, h))]
    for layer in cfg.stage_layers(stage):
        shapes += _layer_shapes(cfg, layer)
    if stage == cfg.pp - 1:
        shapes += [
            ("head.norm.weight", (h,)),
            ("head.norm.bias", (h,)),
            ("head.out.weight", (cfg.vocab // tp, h)),
        ]
    return shapes


def stage_parameter_numels(cfg: GPTConfig, stage: int) -> list[int]:
    numels = []
    for _, shape in stage_parameter_shapes(cfg, stage):
        n = 1
        for d in shape:
            n *= d
        numels.append(n)
    return numels


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """Parameters whose gradients are all-reduced together."""

    index: int
    """Position in the sync order."""
    params: tuple[int, ...]
    """Indices into the parameter list, in packing order."""
    numel: int
    """Elements of the flat buffer."""


def plan_buckets(sizes_bytes: Sequence[int], numels: Sequence[int], bucket_bytes: int) -> list[Bucket]:
    """Pack parameters (given by size, in model order) into buckets, last parameter first.

    As DDP does: the last layers' gradients are ready first. A bucket closes once it reaches
    the cap, so a parameter larger than the cap gets a bucket of its own.
    """
    buckets: list[Bucket] = []
    current: list[int] = []
    filled = 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        filled += sizes_bytes[i]
        if filled >= bucket_bytes:
            buckets.append(
                Bucket(index=len(buckets), params=tuple(current), numel=sum(numels[j] for j in current))
            )
            current, filled = [], 0
    if current:
        buckets.append(
            Bucket(index=len(buckets), params=tuple(current), numel=sum(numels[j] for j in current))
        )
    return buckets


def stage_buckets(cfg: GPTConfig, stage: int, itemsize: int) -> list[Bucket]:
    """The DP gradient buckets of a rank of ``stage``."""
    numels = stage_parameter_numels(cfg, stage)
    return plan_buckets([n * itemsize for n in numels], numels, max(1, int(cfg.grad_bucket_mb * MIB)))
