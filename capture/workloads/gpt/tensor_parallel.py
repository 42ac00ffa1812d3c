"""Megatron-style tensor parallelism: the conjugate region functions and the parallel layers.

A column-parallel linear splits its output features over the TP ranks and is entered through
``copy_to_tp`` (identity forward, all-reduce of the input gradient backward); a row-parallel
linear splits its input features and leaves through ``reduce_from_tp`` (all-reduce forward,
identity backward). With tp == 1 both are plain identities and no collective is issued.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from prism.capture.workloads.gpt.init import ParamFactory


@dataclass(frozen=True, kw_only=True)
class TPGroup:
    """This rank's tensor-parallel group."""

    rank: int
    """Index inside the group (which shard of split parameters this rank holds)."""
    size: int
    """Tensor-parallel degree."""
    group: dist.ProcessGroup | None
    """The process group; None when size == 1 (no communication at all)."""

    def all_reduce(self, x: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """In-place all-reduce over the group (no-op for size 1); returns ``x``."""
        if self.size > 1:
            dist.all_reduce(x, op=op, group=self.group)
        return x


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.tp.all_reduce(grad.contiguous()), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        return tp.all_reduce(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Enter a tensor-parallel region: identity forward, all-reduce of the gradient backward."""
    return x if tp.size == 1 else _CopyToTP.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Leave a tensor-parallel region: all-reduce forward, identity backward."""
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


class ColumnParallelLinear(nn.Module):
    """``y_r = x A_r^T + b_r``: rows of the full weight (output features) split over TP ranks."""

    def __init__(
        self,
        name: str,
        *,
        in_features: int,
        out_features: int,
        bound: float,
        factory: ParamFactory,
        tp: TPGroup,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.weight = factory.uniform(f"{name}.weight", (out_features, in_features), bound, shard_dim=0)
        self.bias = factory.constant((out_features,), 0.0, shard_dim=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = sum_r x_r A_r^T + b``: columns (input features) split; bias added after the all-reduce."""

    def __init__(
        self,
        name: str,
        *,
        in_features: int,
        out_features: int,
        bound: float,
        factory: ParamFactory,
        tp: TPGroup,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.weight = factory.uniform(f"{name}.weight", (out_features, in_features), bound, shard_dim=1)
        self.bias = factory.constant((out_features,), 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(F.linear(x, self.weight), self.tp) + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split: out-of-range ids look up zeros, then all-reduce."""

    def __init__(
        self, name: str, *, vocab: int, dim: int, bound: float, factory: ParamFactory, tp: TPGroup
    ) -> None:
        super().__init__()
        self.tp = tp
        self.weight = factory.uniform(f"{name}.weight", (vocab, dim), bound, shard_dim=0)
        self.start = tp.rank * (vocab // tp.size)
        self.end = self.start + vocab // tp.size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill_(outside, 0)
        out = F.embedding(local, self.weight).masked_fill_(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.tp)
