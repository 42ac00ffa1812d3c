"""Pipeline parallelism with torch.distributed.pipelining, data-parallel across pipelines.

    torchrun --nproc-per-node 2 examples/pp.py --pp 2 --schedule 1F1B [--steps 20] [--microbatches 4]

The mesh is (pp, dp) with dp the faster-varying rank index, as Megatron lays ranks out. The model
(embedding, blocks, head) is cut into ``pp`` stages, or ``2 * pp`` for the schedules that give
each rank two stages (Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV). No
example inputs are given to the stages: they infer the shapes between them on the first step.
After each step, the gradients of a rank's stages are averaged across its dp group with one
all-reduce of a flat buffer.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

SCHEDULES = {
    "GPipe": ScheduleGPipe,
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
    "DualPipeV": ScheduleDualPipeV,
}
SINGLE_STAGE = ("GPipe", "1F1B")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")  # rank r holds stages r and 2 * pp - 1 - r


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class StageModule(nn.Module):
    """One pipeline stage: the embedding on the first, the head on the last, blocks between."""

    def __init__(self, *, vocab: int, hidden: int, blocks: int, first: bool, last: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden) if first else None
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(blocks))
        self.head = nn.Linear(hidden, vocab) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


def stage_indices(schedule: str, pp: int, pp_rank: int) -> list[int]:
    if schedule in SINGLE_STAGE:
        return [pp_rank]
    if schedule in V_SHAPED:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank, pp_rank + pp]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="1F1B")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers-per-stage", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    if world % args.pp:
        raise SystemExit(f"world size {world} is not a multiple of --pp {args.pp}")
    mesh = init_device_mesh("cpu", (args.pp, world // args.pp), mesh_dim_names=("pp", "dp"))
    pp_rank, dp_group = mesh.get_local_rank("pp"), mesh.get_group("dp")
    num_stages = args.pp * (1 if args.schedule in SINGLE_STAGE else 2)

    stages, params = [], []
    for index in stage_indices(args.schedule, args.pp, pp_rank):
        torch.manual_seed(index)  # every dp replica of a stage starts from the same weights
        module = StageModule(
            vocab=args.vocab,
            hidden=args.hidden,
            blocks=args.layers_per_stage,
            first=index == 0,
            last=index == num_stages - 1,
        )
        stages.append(
            PipelineStage(module, index, num_stages, torch.device("cpu"), group=mesh.get_group("pp"))
        )
        params += list(module.parameters())

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))

    schedule_cls = SCHEDULES[args.schedule]
    schedule = schedule_cls(
        stages[0] if args.schedule in SINGLE_STAGE else stages, args.microbatches, loss_fn=loss_fn
    )
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    holds_first = any(stage.is_first for stage in stages)
    holds_last = any(stage.is_last for stage in stages)
    generator = torch.Generator().manual_seed(mesh.get_local_rank("dp"))
    for step in range(args.steps):
        # Every stage draws the batch so that the first and last stage agree on it.
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator)
        inputs = (tokens[:, :-1],) if holds_first else ()
        target = tokens[:, 1:] if holds_last else None
        losses: list[torch.Tensor] = []
        optimizer.zero_grad(set_to_none=True)
        schedule.step(*inputs, target=target, losses=losses if holds_last else None)
        grads = [p.grad for p in params if p.grad is not None]
        if dp_group.size() > 1 and grads:
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=dp_group)
            flat /= dp_group.size()
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(reduced)
        optimizer.step()
        if holds_last and mesh.get_local_rank("dp") == 0 and step % 10 == 0:
            print(f"step {step} loss {torch.stack(losses).mean().item():.3f} ({args.schedule}, pp {args.pp})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
