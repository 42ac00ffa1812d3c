"""A Hugging Face transformers GPT-2, built from its config, trained under DistributedDataParallel.

    torchrun --nproc-per-node 2 examples/hf_gpt2_ddp.py [--steps 20] [--layers 2] [--hidden 128]

Nothing is downloaded: the model is ``GPT2LMHeadModel(GPT2Config(...))`` with fresh weights,
trained on random tokens (the labels are the inputs; the model shifts them itself).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq,
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=args.heads,
    )
    model = DistributedDataParallel(GPT2LMHeadModel(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        tokens = torch.randint(args.vocab, (args.batch, args.seq), generator=generator)
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
