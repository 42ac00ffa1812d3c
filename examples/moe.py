"""A small mixture-of-experts model with expert parallelism, as a user writes it.

    torchrun --nproc-per-node 4 examples/moe.py [--ep 4] [--experts 2] [--steps 20] [--hidden 64]
                                                [--layers 2] [--device cuda]

Each block mixes tokens with a linear layer, then routes each token to one expert (top-1) among
ep x experts: the block's ranks first exchange how many tokens each sends to each expert (an
all-to-all whose counts give the next one's split sizes), then the tokens themselves (the
differentiable functional all-to-all, as torchtitan's), run them through the experts they hold and send them back. The ep
ranks of a group hold different experts; the ranks holding the same experts (expert data
parallel) all-reduce those experts' gradients, and every rank all-reduces the dense ones.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import init_device_mesh


class Expert(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, 2 * hidden)
        self.down = nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


class MoE(nn.Module):
    """Top-1 routing over ``ep`` x ``local`` experts, ``local`` of them on this rank."""

    def __init__(self, hidden: int, local: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.group, self.ep, self.local = group, dist.get_world_size(group), local
        self.router = nn.Linear(hidden, self.ep * local)
        self.experts = nn.ModuleList(Expert(hidden) for _ in range(local))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, expert = self.router(x).softmax(-1).max(-1)
        order = expert.argsort()
        counts = torch.bincount(expert, minlength=self.ep * self.local)  # tokens for each expert
        received_counts = torch.empty_like(counts)  # per source rank, for each of this rank's experts
        dist.all_to_all_single(received_counts, counts, group=self.group)
        sent = counts.view(self.ep, self.local).sum(1).tolist()
        by_source = received_counts.view(self.ep, self.local)
        received = all_to_all_single_autograd(x[order], by_source.sum(1).tolist(), sent, self.group)
        chunks = received.split(by_source.flatten().tolist())
        ran = torch.cat([self.experts[i % self.local](chunk) for i, chunk in enumerate(chunks)])
        back = all_to_all_single_autograd(ran, sent, by_source.sum(1).tolist(), self.group)
        return back[order.argsort()] * weight.unsqueeze(-1)


class Block(nn.Module):
    def __init__(self, hidden: int, local: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.moe = MoE(hidden, local, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.norm(x))
        return x + self.moe(x)


class Model(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, local: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, local, group) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def all_reduce_mean(params: list[nn.Parameter], group: dist.ProcessGroup | None) -> None:
    """Average the gradients of ``params`` over ``group`` in one call."""
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, default=2, help="expert-parallel ranks")
    parser.add_argument("--experts", type=int, default=2, help="experts per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per rank per step")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world // args.ep, args.ep), mesh_dim_names=("edp", "ep"))
    torch.manual_seed(mesh.get_local_rank("ep"))  # experts differ across ep, dense weights do not
    model = Model(args.vocab, args.hidden, args.layers, args.experts, mesh.get_group("ep")).to(device)
    with torch.no_grad():  # dense weights alike on every rank
        torch.manual_seed(0)
        for name, p in model.named_parameters():
            if ".experts." not in name:
                p.copy_(torch.randn_like(p) * 0.02)
    experts = [p for n, p in model.named_parameters() if ".experts." in n]
    dense = [p for n, p in model.named_parameters() if ".experts." not in n]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        tokens = torch.randint(args.vocab, (args.tokens + 1,), generator=generator).to(device)
        logits = model(tokens[:-1])
        loss = nn.functional.cross_entropy(logits, tokens[1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        all_reduce_mean(dense, None)
        if world > args.ep:
            all_reduce_mean(experts, mesh.get_group("edp"))
        optimizer.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
