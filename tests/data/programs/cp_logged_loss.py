"""Context parallel where the first rank of each sequence does more than its peers: it averages
the loss over the data-parallel replicas for its log line, on the dp group of the ranks holding
the first slice (the other slices' ranks never call it).

    torchrun --nproc-per-node 4 tests/data/programs/cp_logged_loss.py [--cp 2] [--steps 20]

The ranks form a (dp, cp) mesh; each holds a slice of every sequence and the gradients are
averaged over all ranks.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=32)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size() // args.cp, args.cp), mesh_dim_names=("dp", "cp"))
    cp_rank = mesh.get_local_rank("cp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.hidden, 4 * args.hidden), nn.GELU(), nn.Linear(4 * args.hidden, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        x = torch.randn(16, args.hidden, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
        if cp_rank == 0:  # the first slice's ranks log the loss of the replicas
            logged = loss.detach().clone()
            dist.all_reduce(logged, group=mesh.get_group("dp"))
            if dist.get_rank() == 0 and step % 10 == 0:
                print(f"step {step} loss {logged.item() / mesh.size(0):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
