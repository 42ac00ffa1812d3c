"""Gradient buckets: reverse parameter order, size cap, every parameter exactly once."""

from __future__ import annotations

import torch
from torch import nn

from prism.capture.workloads.gpt.data_parallel import GradSync
from prism.schemas.grad_buckets import MIB, plan_buckets


def test_buckets_take_parameters_last_first_and_close_at_the_cap() -> None:
    sizes = [40, 10, 30, 30, 100, 5]
    buckets = plan_buckets(sizes, [s // 2 for s in sizes], bucket_bytes=50)
    assert [b.params for b in buckets] == [(5, 4), (3, 2), (1, 0)]
    assert [b.index for b in buckets] == [0, 1, 2]
    assert [b.numel for b in buckets] == [52, 30, 25]


def test_oversized_parameter_gets_its_own_bucket_and_all_fit_in_one_when_small() -> None:
    assert [b.params for b in plan_buckets([10, 500, 10], [1, 1, 1], bucket_bytes=100)] == [(2, 1), (0,)]
    assert [b.params for b in plan_buckets([1, 2, 3], [1, 1, 1], bucket_bytes=MIB)] == [(2, 1, 0)]


def test_grad_sync_with_one_replica_keeps_buckets_but_touches_nothing() -> None:
    params = [nn.Parameter(torch.ones(1000)) for _ in range(4)]  # 4000 bytes each
    for p in params:
        p.grad = torch.full_like(p, 3.0)
    sync = GradSync(params, group=None, dp=1, bucket_mb=6000 / MIB)
    assert [b.params for b in sync.buckets] == [(3, 2), (1, 0)]
    sync()
    assert all(torch.equal(p.grad, torch.full_like(p, 3.0)) for p in params)
