"""A Hugging Face transformers Llama trained the way large jobs train one: FSDP2 over the data-
parallel ranks, optionally DTensor tensor parallelism inside each decoder layer, gradient
accumulation, gradient clipping and a cosine learning-rate schedule.

    torchrun --nproc-per-node 2 examples/hf_llama.py [--tp 1] [--accumulate 2] [--steps 20]
                                                     [--layers 2] [--hidden 128] [--device cuda]

Nothing is downloaded: the model is ``LlamaForCausalLM(LlamaConfig(...))`` with fresh weights
(grouped-query attention: half as many key/value heads as query heads), trained on random
tokens. The mesh is (dp, tp), tp the fastest-varying rank index: each layer's attention and
MLP projections are split column-wise then row-wise across the tp ranks, and FSDP2 shards the
result across the dp ranks. Each optimizer step takes ``--accumulate`` microbatches; FSDP2
reduce-scatters gradients only after the last. On CPU over gloo; with ``--device cuda`` each
rank on GPU ``LOCAL_RANK`` over NCCL.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

TP_PLAN = {
    "self_attn.q_proj": ColwiseParallel(),
    "self_attn.k_proj": ColwiseParallel(),
    "self_attn.v_proj": ColwiseParallel(),
    "self_attn.o_proj": RowwiseParallel(),
    "mlp.gate_proj": ColwiseParallel(),
    "mlp.up_proj": ColwiseParallel(),
    "mlp.down_proj": RowwiseParallel(),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tp", type=int, default=1, help="tensor-parallel ranks (divides the world and the heads)"
    )
    parser.add_argument("--accumulate", type=int, default=2, help="microbatches per optimizer step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    dp = dist.get_world_size() // args.tp
    mesh = init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(args.heads // 2, args.tp),
        max_position_embeddings=args.seq,
    )
    model = LlamaForCausalLM(config).to(device)
    for layer in model.model.layers:
        if args.tp > 1:
            parallelize_module(layer, mesh["tp"], TP_PLAN)
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    # The tp ranks of a replica see the same batch; the replicas, different ones.
    generator = torch.Generator().manual_seed(mesh.get_local_rank("dp"))
    for step in range(args.steps):
        for micro in range(args.accumulate):
            model.set_requires_gradient_sync(micro == args.accumulate - 1)
            tokens = torch.randint(args.vocab, (args.batch, args.seq), generator=generator).to(device)
            loss = model(input_ids=tokens, labels=tokens).loss / args.accumulate
            loss.backward()
        norm = clip_grad_norm(model, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item() * args.accumulate:.3f} grad norm {norm:.3f}")
    dist.destroy_process_group()


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """``clip_grad_norm_`` over gradients that live on different meshes (dp for the embeddings and
    norms, dp x tp for the split projections): each group's norm made whole, then one factor."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is not None:
            groups.setdefault(p.grad.device_mesh, []).append(p.grad)
    norms = [torch.nn.utils.get_total_norm(grads).full_tensor() for grads in groups.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for grads in groups.values():
        torch.nn.utils.clip_grads_with_norm_(grads, max_norm, total)
    return float(total)


if __name__ == "__main__":
    main()
