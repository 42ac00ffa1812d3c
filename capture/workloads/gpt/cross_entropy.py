"""Cross-entropy over vocabulary-parallel logits, without gathering them (Megatron's formulation).

Each TP rank holds the logits of its slice of the vocabulary. The loss needs three all-reduces
over the TP group: MAX of the per-token logit maximum (for a stable softmax), SUM of the target
logit (only the rank owning the target contributes) and SUM of the exponentials.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism.capture.workloads.gpt.tensor_parallel import TPGroup


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        vocab_local = logits.shape[-1]
        start = tp.rank * vocab_local
        logits_max = tp.all_reduce(logits.amax(dim=-1), op=dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (labels < start) | (labels >= start + vocab_local)
        local = (labels - start).masked_fill_(outside, 0)
        target = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill_(outside, 0.0)
        tp.all_reduce(target)
        softmax = shifted.exp_()  # reuses the shifted logits' storage, as Megatron does
        sum_exp = tp.all_reduce(softmax.sum(dim=-1))
        loss = sum_exp.log() - target
        softmax.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        softmax, local, outside = ctx.saved_tensors
        grad = softmax  # d loss / d logits = softmax - onehot(target); built in place
        hit = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local.unsqueeze(-1), -hit)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """Mean token loss from this rank's vocabulary slice of the logits ([..., vocab / tp])."""
    # Half-precision logits are upcast: the softmax sums over the whole vocabulary.
    compute = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
    return _VocabParallelCrossEntropy.apply(compute, labels, tp).mean()
