"""A program's static memory on CPU, on a C++ backend: its tensors' storages plus DDP's gradient buckets."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from prism.capture.step_iterations import ddp_bucket_bytes, live_tensor_bytes


@pytest.fixture
def one_rank_world():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.mark.parametrize("bucket_view", [False, True])
def test_ddp_buckets_count_once(one_rank_world: None, bucket_view: bool) -> None:
    gc.collect()
    before = live_tensor_bytes(cuda=False, buckets_in_python=False)
    ddp = DistributedDataParallel(_model(), gradient_as_bucket_view=bucket_view)
    ddp(torch.ones(2, 64)).sum().backward()
    torch.optim.SGD(ddp.parameters(), lr=0.1).step()  # as a program does: its gradients reach Python
    params = _param_bytes(ddp)
    held = live_tensor_bytes(cuda=False, buckets_in_python=False) - before
    if bucket_view:  # gradients are views into the buckets: their storages are the buckets
        assert ddp_bucket_bytes(ddp) == 0
        assert held == pytest.approx(2 * params, abs=4096)
    else:  # parameters, their gradients, and a flat copy of the gradients in the buckets
        assert ddp_bucket_bytes(ddp) == params
        assert held == pytest.approx(3 * params, abs=4096)
