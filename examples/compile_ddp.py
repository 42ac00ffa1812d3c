"""A torch.compile'd model under DistributedDataParallel.

    torchrun --nproc-per-node 2 examples/compile_ddp.py [--steps 20] [--compile-inside] [--device cuda]

By default DDP wraps the model and ``torch.compile`` wraps the DDP module, as DDP's docs show
it (in torch 2.13 on CPU, dynamo stops at DDP's forward there and the model runs eagerly);
``--compile-inside`` compiles the model first and wraps the compiled module in DDP, which runs
compiled code. The model is the MLP language-model stand-in of examples/ddp.py. On CPU over gloo;
with ``--device cuda`` each rank on GPU ``LOCAL_RANK`` over NCCL.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument(
        "--compile-inside", action="store_true", help="compile the model, then wrap it in DDP"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = build_model(args.vocab, args.hidden, args.layers).to(device)
    if args.compile_inside:
        model = DistributedDataParallel(torch.compile(model))
    else:
        model = torch.compile(DistributedDataParallel(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
