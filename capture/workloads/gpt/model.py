"""The GPT decoder, cut into pipeline stages and sharded over tensor-parallel ranks.

Parameters are named after their place in the *full* model (``layers.{global layer}.attn.qkv.weight``,
``embed.word.weight``, ...) and made by ``ParamFactory``, so every stage/shard holds exactly its
piece of one deterministic model. The fused QKV weight's output rows are ordered
[head, (q, k, v), head_dim], so a contiguous split over TP ranks hands each rank whole heads.

Init scale: linear weights uniform with bound 1/sqrt(fan_in) (PyTorch's default), the two
residual projections further scaled by 1/sqrt(2 * layers) (GPT-2), embeddings with std 0.02;
layer-norm weights 1, all biases 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from prism.capture import annotate
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.cross_entropy import vocab_parallel_cross_entropy
from prism.capture.workloads.gpt.init import ParamFactory
from prism.capture.workloads.gpt.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    VocabParallelEmbedding,
    copy_to_tp,
)
from prism.schemas.annotations import Part

EMBED_BOUND = 0.02 * math.sqrt(3.0)  # uniform with std 0.02


class LayerNorm(nn.Module):
    """Layer norm whose (replicated) weight and bias come from the factory."""

    def __init__(self, dim: int, factory: ParamFactory) -> None:
        super().__init__()
        self.weight = factory.constant((dim,), 1.0)
        self.bias = factory.constant((dim,), 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias)


class Embedding(nn.Module):
    """Vocabulary-parallel token embedding plus a replicated learned position embedding."""

    def __init__(self, cfg: GPTConfig, factory: ParamFactory, tp: TPGroup) -> None:
        super().__init__()
        self.word = VocabParallelEmbedding(
            "embed.word", vocab=cfg.vocab, dim=cfg.hidden, bound=EMBED_BOUND, factory=factory, tp=tp
        )
        self.position = nn.Module()
        self.position.weight = factory.uniform(
            "embed.position.weight", (cfg.seq_len, cfg.hidden), EMBED_BOUND
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.word(ids) + self.position.weight[: ids.shape[1]]


class Attention(nn.Module):
    """Causal self-attention: column-parallel QKV (whole heads per rank), row-parallel output."""

    def __init__(self, cfg: GPTConfig, prefix: str, factory: ParamFactory, tp: TPGroup) -> None:
        super().__init__()
        h = cfg.hidden
        residual = 1.0 / math.sqrt(2 * cfg.layers)
        self.qkv = ColumnParallelLinear(
            f"{prefix}.qkv", in_features=h, out_features=3 * h, bound=h**-0.5, factory=factory, tp=tp
        )
        self.proj = RowParallelLinear(
            f"{prefix}.proj", in_features=h, out_features=h, bound=h**-0.5 * residual, factory=factory, tp=tp
        )
        self.heads = cfg.heads // tp.size
        self.head_dim = cfg.head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads, 3, self.head_dim)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # each [b, heads, s, head_dim]
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """fc1 (column-parallel) -> GELU -> fc2 (row-parallel)."""

    def __init__(self, cfg: GPTConfig, prefix: str, factory: ParamFactory, tp: TPGroup) -> None:
        super().__init__()
        h, f = cfg.hidden, cfg.ffn
        residual = 1.0 / math.sqrt(2 * cfg.layers)
        self.fc1 = ColumnParallelLinear(
            f"{prefix}.fc1", in_features=h, out_features=f, bound=h**-0.5, factory=factory, tp=tp
        )
        self.fc2 = RowParallelLinear(
            f"{prefix}.fc2", in_features=f, out_features=h, bound=f**-0.5 * residual, factory=factory, tp=tp
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig, index: int, factory: ParamFactory, tp: TPGroup) -> None:
        super().__init__()
        self.index = index
        prefix = f"layers.{index}"
        self.norm1 = LayerNorm(cfg.hidden, factory)
        self.attn = Attention(cfg, f"{prefix}.attn", factory, tp)
        self.norm2 = LayerNorm(cfg.hidden, factory)
        self.mlp = MLP(cfg, f"{prefix}.mlp", factory, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """Final layer norm and the column-parallel (untied, bias-free) LM head: this rank's vocab logits."""

    def __init__(self, cfg: GPTConfig, factory: ParamFactory, tp: TPGroup) -> None:
        super().__init__()
        self.tp = tp
        self.norm = LayerNorm(cfg.hidden, factory)
        self.out = nn.Module()
        self.out.weight = factory.uniform(
            "head.out.weight", (cfg.vocab, cfg.hidden), cfg.hidden**-0.5, shard_dim=0
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(self.norm(x), self.tp), self.out.weight)


class GPTStage(nn.Module):
    """The layers of one pipeline stage; the first adds the embedding, the last the head and loss."""

    def __init__(self, cfg: GPTConfig, *, stage: int, factory: ParamFactory, tp: TPGroup) -> None:
        super().__init__()
        self.stage = stage
        self.tp = tp
        self.embed = Embedding(cfg, factory, tp) if stage == 0 else None
        self.layers = nn.ModuleList(TransformerLayer(cfg, i, factory, tp) for i in cfg.stage_layers(stage))
        self.head = Head(cfg, factory, tp) if stage == cfg.pp - 1 else None

    @property
    def is_first(self) -> bool:
        return self.embed is not None

    @property
    def is_last(self) -> bool:
        return self.head is not None

    def forward(self, x: torch.Tensor, *, mb: int, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (first stage) or activations in; activations or, on the last stage, the mean loss out."""
        marks = {"stage": self.stage, "mb": mb}
        if self.embed is not None:
            x = annotate.block(self.embed, x, part=Part.EMBED, **marks)
        for layer in self.layers:
            x = annotate.block(layer, x, layer=layer.index, **marks)
        if self.head is None:
            return x
        if labels is None:
            raise ValueError("the last stage needs labels")
        logits = annotate.block(self.head, x, part=Part.HEAD, **marks)
        return annotate.block(
            lambda z: vocab_parallel_cross_entropy(z, labels, self.tp), logits, part=Part.LOSS, **marks
        )
