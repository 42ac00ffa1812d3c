"""Context parallelism, as a user writes it: each rank holds a slice of every sequence.

    torchrun --nproc-per-node 4 examples/cp.py [--cp 2] [--steps 20] [--hidden 64] [--seq 64]
                                               [--layers 2] [--device cuda]

The ranks form a (dp, cp) mesh. In each causal self-attention layer a rank's queries are its own
slice of the sequence; it all-gathers the keys and values of the whole sequence from its cp group
(the differentiable functional all-gather: their gradients come back by a reduce-scatter) and
masks the future by the global positions. The loss of a rank is that of its slice; the gradients
are averaged over the dp x cp ranks (a flattened mesh), as every rank's data is different.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._functional_collectives import all_gather_single_autograd
from torch.distributed.device_mesh import init_device_mesh


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.heads, self.group = heads, group
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, local, hidden = x.shape
        q, k, v = self.qkv(x).view(batch, local, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        # Keys and values of the whole sequence: the cp ranks' slices in order, along the sequence.
        k, v = (all_gather_single_autograd(t.contiguous(), gather_dim=2, group=self.group) for t in (k, v))
        first = dist.get_rank(self.group) * local
        rows = torch.arange(first, first + local, device=x.device)[:, None]
        cols = torch.arange(k.shape[2], device=x.device)[None, :]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(cols > rows, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(batch, local, hidden))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attention = Attention(hidden, heads, group)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, vocab: int, hidden: int, heads: int, layers: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, group) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, default=2, help="context-parallel ranks")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64, help="tokens of a whole sequence")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()

    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    mesh = init_device_mesh(
        device.type, (dist.get_world_size() // args.cp, args.cp), mesh_dim_names=("dp", "cp")
    )
    cp_rank, local = mesh.get_local_rank("cp"), args.seq // args.cp
    torch.manual_seed(0)
    model = Model(args.vocab, args.hidden, args.heads, args.layers, mesh.get_group("cp")).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(mesh.get_local_rank("dp"))  # one sequence for a cp group
    for step in range(args.steps):
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator).to(device)
        mine = slice(cp_rank * local, (cp_rank + 1) * local)
        logits = model(tokens[:, :-1][:, mine])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:][:, mine].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # over dp x cp: every rank's tokens are its own
        flat /= dist.get_world_size()
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        optimizer.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
