"""The GPT's own count of what one of its ranks holds: its parameters, their DP gradient
buckets and the bytes they keep across iterations with Adam.

The capture checks a layout fits before running it (``prism.capture.preflight``) and the
fidelity check's real runs take their static memory from here; the graph builder never does:
it works from what the capture measured (``prism.capture.held_parameters``)."""

from __future__ import annotations

from prism.capture.workloads.gpt.config import GPTConfig
from prism.schemas.grad_buckets import MIB, Bucket, plan_buckets


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


def stage_buckets(cfg: GPTConfig, stage: int, itemsize: int) -> list[Bucket]:
    """The DP gradient buckets of a rank of ``stage``."""
    numels = stage_parameter_numels(cfg, stage)
    return plan_buckets([n * itemsize for n in numels], numels, max(1, int(cfg.grad_bucket_mb * MIB)))


def static_bytes(cfg: GPTConfig, stage: int) -> int:
    """Bytes a rank of ``stage`` holds across iterations: weights, gradients, Adam's two moments
    and its float32 step counter per parameter, and the DP bucket buffers where dp > 1."""
    numels = stage_parameter_numels(cfg, stage)
    params = sum(numels) * cfg.itemsize
    adam_steps = 4 * len(numels)
    buckets = sum(b.numel for b in stage_buckets(cfg, stage, cfg.itemsize)) * cfg.itemsize
    return 4 * params + adam_steps + (buckets if cfg.dp > 1 else 0)
