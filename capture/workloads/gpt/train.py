"""``GPTWorkload``: one rank of the GPT job (its stage, its TP shard, its DP replica) and its step.

An iteration is: zero gradients, the 1F1B schedule of ``microbatches`` forwards and backwards
(loss of each microbatch divided by M), the bucketed DP gradient all-reduce, one Adam step.

Gradients are allocated once at setup and zeroed in place each iteration
(``set_to_none=False``): memory stays the same from the first iteration on, as with a
persistent gradient buffer in Megatron. The optimizer is plain ``torch.optim.Adam`` on the
parameters in their own dtype (no master weights, no loss scaling).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from prism.capture import annotate
from prism.capture.workloads.gpt import data
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.data_parallel import GradSync
from prism.capture.workloads.gpt.init import ParamFactory
from prism.capture.workloads.gpt.model import GPTStage
from prism.capture.workloads.gpt.parallel_state import ParallelState, build_parallel_state
from prism.capture.workloads.gpt.pipeline import P2P, ForwardStep, run_schedule
from prism.schemas.pipeline_schedule import one_f_one_b


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What one training iteration reports."""

    loss: float | None
    """Mean loss over this rank's microbatches; only on the last stage (None elsewhere)."""


def resolve_device(cfg: GPTConfig) -> torch.device:
    """``cpu``, or ``cuda:{LOCAL_RANK}`` for cuda."""
    if cfg.device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class GPTWorkload:
    """One rank of the GPT training job; build after torch.distributed is initialised."""

    def __init__(self, cfg: GPTConfig) -> None:
        layout = cfg.layout
        if dist.get_world_size() != layout.world_size:
            raise ValueError(f"world size {dist.get_world_size()} does not match {layout}")
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.parallel: ParallelState = build_parallel_state(layout, self.rank)
        self.stage = self.parallel.coords.pp
        self.device = resolve_device(cfg)
        self.dtype = getattr(torch, cfg.dtype)
        tp = self.parallel.tp
        factory = ParamFactory(
            seed=cfg.seed, tp_rank=tp.rank, tp_size=tp.size, device=self.device, dtype=self.dtype
        )
        self.model = GPTStage(cfg, stage=self.stage, factory=factory, tp=tp)
        params = list(self.model.parameters())
        self.parameter_count = sum(p.numel() for p in params)
        for p in params:
            p.grad = torch.zeros_like(p)
        # Adam's default eps (1e-8) is 0 in float16, where a zero gradient then gives 0/0 = NaN.
        eps = max(1e-8, torch.finfo(self.dtype).tiny)
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=eps)
        self.grad_sync = GradSync(
            params, group=self.parallel.dp_group, dp=cfg.dp, bucket_mb=cfg.grad_bucket_mb
        )
        self.schedule = one_f_one_b(stage=self.stage, stages=cfg.pp, microbatches=cfg.microbatches)
        self.p2p = P2P(
            stage=self.stage,
            prev_rank=self.parallel.prev_rank,
            next_rank=self.parallel.next_rank,
            shape=(cfg.micro_batch_size, cfg.seq_len, cfg.hidden),
            dtype=self.dtype,
            device=self.device,
        )

    def _forward_step(self, iteration: int, losses: list[torch.Tensor]) -> ForwardStep:
        """The schedule's forward callback for ``iteration``; collects the unscaled losses."""
        cfg, model = self.cfg, self.model

        def step(mb: int, x: torch.Tensor | None) -> torch.Tensor:
            gmb = data.global_microbatch(cfg, iteration=iteration, dp_index=self.parallel.coords.dp, mb=mb)
            if model.is_first:
                x = data.inputs(cfg, gmb, self.device)
            labels = data.labels(cfg, gmb, self.device) if model.is_last else None
            out = model(x, mb=mb, labels=labels)
            if not model.is_last:
                return out
            losses.append(out.detach())
            return out / cfg.microbatches

        return step

    def train_step(self, iteration: int) -> StepResult:
        """One full iteration (1F1B, gradient sync, Adam), marked for the trace."""
        losses: list[torch.Tensor] = []
        with annotate.iteration(iteration):
            self.optimizer.zero_grad(set_to_none=False)
            run_schedule(
                self.schedule,
                stage=self.stage,
                p2p=self.p2p,
                forward_step=self._forward_step(iteration, losses),
            )
            self.grad_sync()
            with annotate.optimizer():
                self.optimizer.step()
            if self.device.type == "cuda":  # the iteration ends when its device work does
                torch.cuda.synchronize(self.device)
        loss = torch.stack(losses).mean().item() if losses else None
        return StepResult(loss=loss)
