"""A GPT trained with Megatron-core, tensor, pipeline and data parallel, as Megatron's own loop runs it.

    torchrun --nproc-per-node 8 examples/megatron_gpt.py --tp 2 --pp 2 [--steps 20] [--layers 4]
                                                        [--microbatches 4] [--distributed-optimizer]

Needs a CUDA device per rank (NCCL) and Megatron-core (``pip install -e ".[megatron]"``).
Megatron lays ranks out tp fastest, then dp, then pp (``initialize_model_parallel``'s
``tp-cp-ep-dp-pp``); data parallel is what is left of the world. The model is Megatron-core's ``GPTModel`` with its local layer spec (no
Transformer Engine), wrapped in Megatron's ``DistributedDataParallel`` (gradients in contiguous
buckets, all-reduced or, with ``--distributed-optimizer``, reduce-scattered), trained by
``get_megatron_optimizer``; each step runs ``get_forward_backward_func()`` over the microbatches
(1F1B across pipeline stages) and ``finalize_model_grads``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig


def batches(vocab: int, micro_batch: int, seq: int, seed: int, device: torch.device):
    """Random token microbatches, each data-parallel replica its own stream."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(vocab, (micro_batch, seq + 1), generator=generator)
        yield {"tokens": tokens[:, :-1].to(device), "labels": tokens[:, 1:].to(device)}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    tokens = batch["tokens"]
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    output = model(tokens, positions, attention_mask=None, labels=batch["labels"])

    def loss_func(per_token_loss: torch.Tensor):
        loss = per_token_loss.float().mean()
        return loss, {"lm loss": loss.detach()}

    return output, loss_func


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=4, help="transformer layers in all, split across --pp")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument(
        "--distributed-optimizer", action="store_true", help="shard optimizer state across dp"
    )
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp
    )
    model_parallel_cuda_manual_seed(1234)
    device = torch.device("cuda", local_rank)

    config = TransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=args.vocab,
        max_sequence_length=args.seq,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    ).to(device)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=args.distributed_optimizer)
    model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-4, use_distributed_optimizer=args.distributed_optimizer),
        [model],
    )
    config.no_sync_func = model.no_sync
    config.finalize_model_grads_func = finalize_model_grads

    data = batches(
        args.vocab, args.micro_batch, args.seq, 1234 + parallel_state.get_data_parallel_rank(), device
    )
    forward_backward = get_forward_backward_func()
    for step in range(args.steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        losses = forward_backward(
            forward_step_func=forward_step,
            data_iterator=data,
            model=model,
            num_microbatches=args.microbatches,
            seq_length=args.seq,
            micro_batch_size=args.micro_batch,
            forward_only=False,
        )
        optimizer.step()
        if losses and step % 10 == 0:
            loss = torch.stack([item["lm loss"] for item in losses]).mean().item()
            print(f"step {step} loss {loss:.4f}", flush=True)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
