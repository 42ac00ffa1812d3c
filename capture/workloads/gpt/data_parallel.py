"""Data-parallel gradient averaging in buckets, after the whole pipeline backward.

Parameters are taken in reverse order (as DDP does: the last layers' gradients are ready
first) and packed into buckets of up to ``grad_bucket_mb`` MiB; a bucket closes once it reaches
the cap, so a parameter larger than the cap gets a bucket of its own. Each bucket owns a flat
buffer allocated once at setup. A sync copies the gradients in, posts an async all-reduce per
bucket, waits for all of them, divides by dp and copies back.

With dp == 1 the buckets and their marks are the same but nothing is copied or communicated
(a one-rank all-reduce is a no-op) and no flat buffers are allocated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from prism.capture import annotate
from prism.schemas.grad_buckets import MIB, Bucket, plan_buckets


class GradSync:
    """Averages this rank's gradients over its data-parallel group, bucket by bucket."""

    def __init__(
        self, params: Sequence[nn.Parameter], *, group: dist.ProcessGroup | None, dp: int, bucket_mb: float
    ):
        self.params = list(params)
        self.group, self.dp = group, dp
        sizes = [p.numel() * p.element_size() for p in self.params]
        self.bucket_bytes = max(1, int(bucket_mb * MIB))
        self.buckets = plan_buckets(sizes, [p.numel() for p in self.params], self.bucket_bytes)
        self._buffers = [self._flat_buffer(b) for b in self.buckets] if dp > 1 else []

    def _flat_buffer(self, bucket: Bucket) -> torch.Tensor:
        first = self.params[bucket.params[0]]
        return torch.empty(bucket.numel, dtype=first.dtype, device=first.device)

    def _views(self, bucket: Bucket, flat: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(slice of the flat buffer, the parameter's gradient) pairs."""
        pairs, offset = [], 0
        for i in bucket.params:
            grad = self.params[i].grad
            pairs.append((flat[offset : offset + grad.numel()].view_as(grad), grad))
            offset += grad.numel()
        return pairs

    def __call__(self) -> None:
        with annotate.grad_sync():
            if self.dp == 1:
                for bucket in self.buckets:
                    with annotate.grad_sync(bucket=bucket.index):
                        pass
                return
            works = []
            for bucket, flat in zip(self.buckets, self._buffers, strict=True):
                with annotate.grad_sync(bucket=bucket.index):
                    for view, grad in self._views(bucket, flat):
                        view.copy_(grad)
                    works.append(dist.all_reduce(flat, group=self.group, async_op=True))
            for work in works:
                work.wait()
            for bucket, flat in zip(self.buckets, self._buffers, strict=True):
                flat.div_(self.dp)
                for view, grad in self._views(bucket, flat):
                    grad.copy_(view)
