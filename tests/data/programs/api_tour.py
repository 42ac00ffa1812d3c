"""A tour of the torch.distributed calls unmodified programs make, for the program-capture tests.

Run under ``prism-capture --tp 2 --pp 1 --dp 512 -- api_tour.py``: it asks for a mixed backend,
builds a 2-D mesh, a locally synchronised group and subgroups, makes plain, object, functional
and batched point-to-point calls, then trains a few optimizer steps. It checks what it can check
about itself, so that a call prism mishandles fails here.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("cpu:gloo,cuda:nccl")
rank, world = dist.get_rank(), dist.get_world_size()
assert (rank, world) == (0, 1024), (rank, world)
mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
tp = mesh.get_group("tp")
assert dist.get_world_size(tp) == 2 and dist.get_world_size(mesh.get_group("dp")) == 512
local = dist.new_group([0, 1], use_local_synchronization=True)
assert dist.get_world_size(local) == 2
mine, _ = dist.new_subgroups(group_size=2)  # the tp groups again: groups must be the layout's
assert dist.get_world_size(mine) == 2
x = torch.ones(4)
dist.all_reduce(x)
dist.barrier()
gathered = [None] * world
dist.all_gather_object(gathered, {"rank": rank})
assert gathered[0] == {"rank": 0}
reduced = funcol.all_reduce(torch.ones(4), "sum", tp)
assert reduced.shape == (4,)
parts = torch.ops._c10d_functional.all_gather_into_tensor(torch.ones(2), 2, tp.group_name)
assert torch.ops._c10d_functional.wait_tensor(parts).shape == (4,)
peer = rank ^ 1
ops = [dist.P2POp(dist.isend, torch.ones(3), peer), dist.P2POp(dist.irecv, torch.zeros(3), peer)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
objects = [None]
dist.broadcast_object_list(objects, src=0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(100):
    model(torch.ones(2, 4)).sum().backward()
    dist.all_reduce(model.weight.grad, group=mesh.get_group("dp"))
    optimizer.step()
    optimizer.zero_grad()
