"""Deterministic sharded initialisation: every full parameter is a fixed function of (seed, name).

Element ``i`` (row-major index in the *full*, unsharded tensor) of parameter ``name`` is
``bound * (2 u - 1)`` with ``u = uniform(derive_key(seed, name), i)``. A rank computes only the
elements of its shard, in slabs of bounded size, so a tp=8 rank never holds the full matrix, and
a tp=2 model and a tp=1 model are exactly the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from prism.capture.workloads.gpt import rng

_SLAB_ELEMENTS = 1 << 22  # bounds the int64 temporaries of one generation pass


@dataclass(frozen=True, kw_only=True)
class Shard:
    """Which contiguous piece of a full tensor a rank holds."""

    dim: int
    """Dimension the tensor is split along."""
    index: int
    """This rank's piece (its tensor-parallel rank)."""
    count: int
    """Number of equal pieces (the tensor-parallel degree)."""

    def local_shape(self, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        size = full_shape[self.dim]
        if size % self.count:
            raise ValueError(f"dimension {self.dim} of {full_shape} does not split into {self.count}")
        return full_shape[: self.dim] + (size // self.count,) + full_shape[self.dim + 1 :]

    def offsets(self, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        step = self.local_shape(full_shape)[self.dim]
        return tuple(self.index * step if d == self.dim else 0 for d in range(len(full_shape)))


def _flat_index(
    full_shape: tuple[int, ...], offsets: tuple[int, ...], local_shape: tuple[int, ...], rows: range, device
) -> torch.Tensor:
    """Row-major indices in the full tensor of local rows ``rows`` (dim 0) of a shard."""
    strides = [math.prod(full_shape[d + 1 :]) for d in range(len(full_shape))]
    sizes = (len(rows),) + local_shape[1:]
    index = torch.zeros(sizes, dtype=torch.int64, device=device)
    for d, size in enumerate(sizes):
        start = offsets[d] + (rows.start if d == 0 else 0)
        coord = torch.arange(start, start + size, dtype=torch.int64, device=device) * strides[d]
        index += coord.view((size,) + (1,) * (len(sizes) - d - 1))
    return index


def uniform_tensor(
    *,
    seed: int,
    name: str,
    full_shape: tuple[int, ...],
    bound: float,
    shard: Shard | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The shard ``shard`` (everything when None) of the full tensor ``name``: uniform in [-bound, bound)."""
    local_shape = full_shape if shard is None else shard.local_shape(full_shape)
    offsets = (0,) * len(full_shape) if shard is None else shard.offsets(full_shape)
    out = torch.empty(local_shape, dtype=dtype, device=device)
    key = rng.derive_key(seed, name)
    row_elements = max(1, math.prod(local_shape[1:]))
    slab_rows = max(1, _SLAB_ELEMENTS // row_elements)
    for start in range(0, local_shape[0], slab_rows):
        rows = range(start, min(start + slab_rows, local_shape[0]))
        index = _flat_index(full_shape, offsets, local_shape, rows, device)
        out[rows.start : rows.stop] = (rng.uniform(key, index) * 2.0 - 1.0).mul_(bound).to(dtype)
    return out


@dataclass(frozen=True, kw_only=True)
class ParamFactory:
    """Makes the parameters of one rank: its shards of the deterministic full model."""

    seed: int
    """Model seed (GPTConfig.seed)."""
    tp_rank: int
    """Tensor-parallel rank: which shard of split parameters to make."""
    tp_size: int
    """Tensor-parallel degree."""
    device: torch.device
    """Where parameters live."""
    dtype: torch.dtype
    """Parameter dtype."""

    def _shard(self, shard_dim: int | None) -> Shard | None:
        return None if shard_dim is None else Shard(dim=shard_dim, index=self.tp_rank, count=self.tp_size)

    def uniform(
        self, name: str, full_shape: tuple[int, ...], bound: float, shard_dim: int | None = None
    ) -> nn.Parameter:
        """Random parameter ``name``; split along ``shard_dim`` over tensor-parallel ranks (None: replicated)."""
        data = uniform_tensor(
            seed=self.seed,
            name=name,
            full_shape=full_shape,
            bound=bound,
            shard=self._shard(shard_dim),
            device=self.device,
            dtype=self.dtype,
        )
        return nn.Parameter(data)

    def constant(
        self, full_shape: tuple[int, ...], value: float, shard_dim: int | None = None
    ) -> nn.Parameter:
        """Constant parameter (layer-norm weights 1, biases 0)."""
        shard = self._shard(shard_dim)
        shape = full_shape if shard is None else shard.local_shape(full_shape)
        return nn.Parameter(torch.full(shape, value, dtype=self.dtype, device=self.device))
