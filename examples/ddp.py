"""Data-parallel training with DistributedDataParallel, as a user writes it.

    torchrun --nproc-per-node 2 examples/ddp.py [--steps 20] [--hidden 256] [--layers 4] [--batch 8]
                                                [--accumulate 1] [--bucket-cap-mb 25]
                                                [--device cuda] [--log-every 10]

A small MLP language-model stand-in trained on random tokens; every rank runs the same model on
its own batch and DDP all-reduces the gradients in buckets during backward. With ``--accumulate
N`` each optimizer step takes N microbatches, the first N-1 under ``no_sync`` (no all-reduce
until the last). On CPU over gloo; with
``--device cuda`` each rank on GPU ``LOCAL_RANK`` over NCCL, its batch copied from the host each step.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def build_model(vocab: int, hidden: int, layers: int) -> nn.Module:
    blocks = [nn.Embedding(vocab, hidden)]
    for _ in range(layers):
        blocks += [
            nn.LayerNorm(hidden),
            nn.Linear(hidden, 4 * hidden),
            nn.GELU(),
            nn.Linear(4 * hidden, hidden),
        ]
    blocks.append(nn.Linear(hidden, vocab))
    return nn.Sequential(*blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=1, help="microbatches per optimizer step")
    parser.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's gradient bucket size")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--log-every", type=int, default=10, help="rank 0 prints the loss (a host sync) every N steps"
    )
    args = parser.parse_args()

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        build_model(args.vocab, args.hidden, args.layers).to(device), bucket_cap_mb=args.bucket_cap_mb
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        for micro in range(args.accumulate):
            last = micro == args.accumulate - 1
            with contextlib.nullcontext() if last else model.no_sync():
                tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
                if micro == 0:
                    optimizer.zero_grad(set_to_none=True)
                (loss / args.accumulate if args.accumulate > 1 else loss).backward()
        optimizer.step()
        if rank == 0 and step % args.log_every == 0:
            print(
                f"step {step} loss {loss.item():.3f} (world {world}, local rank {os.environ.get('LOCAL_RANK')})"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
