"""Megatron-core's process groups on CPU: ``initialize_model_parallel`` with tensor, context,
expert and pipeline parallelism (its own rank order, tp fastest, then cp, ep, dp, pp), and a small
torch model whose gradients are all-reduced over each group a Megatron job reduces over (tensor,
data, data with context, model, context, expert, expert data, tensor-data-context), over the
position-embedding group on the first stage (one rank: a group of the mesh wherever an axis is 1),
and sent from the first pipeline stage to the last. Megatron's layers need CUDA; its groups do not.

    torchrun --nproc-per-node 32 megatron_groups.py --tp 2 --cp 2 --ep 2 --pp 2
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for axis in ("tp", "cp", "ep", "pp"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        context_parallel_size=args.cp,
        expert_model_parallel_size=args.ep,
    )
    groups = [
        ps.get_tensor_model_parallel_group(),
        ps.get_data_parallel_group(),
        ps.get_data_parallel_group(with_context_parallel=True),
        ps.get_model_parallel_group(),
        ps.get_context_parallel_group(),
        ps.get_expert_model_parallel_group(),
        ps.get_expert_data_parallel_group(),
        ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
    ]
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    activation = torch.zeros(8, 64)
    for _ in range(args.steps):
        if args.pp > 1 and ps.is_pipeline_last_stage():
            dist.recv(activation, ps.get_pipeline_model_parallel_prev_rank())
        model(torch.randn(8, 64) + activation).square().mean().backward()
        if (
            args.pp > 1 and ps.is_pipeline_first_stage()
        ):  # before the model group's reduce, which waits for the last stage
            dist.send(model.weight.detach()[:8], ps.get_pipeline_model_parallel_next_rank())
        for group in groups:
            dist.all_reduce(model.weight.grad, group=group)
        if ps.is_rank_in_position_embedding_group():
            dist.all_reduce(model.bias.grad, group=ps.get_position_embedding_group())
        optimizer.step()
        optimizer.zero_grad()
    ps.destroy_model_parallel()


if __name__ == "__main__":
    main()
