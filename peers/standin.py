"""Stand-in data for buffers that a virtual peer would have written.

A receive from a virtual peer must leave finite, deterministic values behind (never uninitialised
memory, which may hold NaN and send the program down another path), and it should cost about
what a real receive costs: one copy of the buffer. Floating buffers get N(0, 1) values copied
from a cached source; integer and bool buffers are zeroed.

Sources are cached per (power-of-two capacity, dtype) and sliced, so varying sizes (all-to-all
splits) reuse a few buffers, and the values for a given size do not depend on what came before.
Sources for CUDA buffers live in pinned host memory and are copied without blocking: they take
no device memory, so the replayed rank's peak device memory stays that of the real program.
"""

from __future__ import annotations

import threading

import torch

_SEED = 0x5EED
_MIN_CAPACITY = 1024

_cache: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}
_lock = threading.Lock()


def fill_standin(dst: torch.Tensor) -> None:
    """Overwrite ``dst`` with the stand-in values for its size and dtype."""
    if dst.numel() == 0:
        return
    if not (dst.is_floating_point() or dst.is_complex()):
        dst.zero_()  # integer tensors cannot require grad
        return
    pinned = dst.device.type == "cuda"
    src = _source(dst.numel(), dst.dtype, "pinned" if pinned else str(dst.device), dst.device)
    with torch.no_grad():  # a receive buffer may be a leaf that requires grad (pipelining's are)
        dst.copy_(src[: dst.numel()].view(dst.shape), non_blocking=pinned)


def standin_values(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``numel`` stand-in values of ``dtype`` on the CPU (what fill_standin writes)."""
    return _source(numel, dtype, "cpu", torch.device("cpu"))[:numel].clone()


def cached_pointers() -> set[int]:
    """Data pointers of the cached sources: host memory prism holds, not the program."""
    with _lock:
        return {src.untyped_storage().data_ptr() for src in _cache.values()}


def clear_cache() -> None:
    """Drop every cached source (frees host memory)."""
    with _lock:
        _cache.clear()


def _capacity(numel: int) -> int:
    return max(_MIN_CAPACITY, 1 << (numel - 1).bit_length())


def _source(numel: int, dtype: torch.dtype, where: str, device: torch.device) -> torch.Tensor:
    key = (_capacity(numel), dtype, where)
    src = _cache.get(key)
    if src is None:
        with _lock:
            src = _cache.get(key)
            if src is None:
                src = _cache[key] = _make(key[0], dtype, where, device)
    return src


def _make(capacity: int, dtype: torch.dtype, where: str, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_SEED)
    values = torch.randn(capacity, generator=generator, dtype=torch.float32).to(dtype)
    if where == "pinned":
        return values.pin_memory()
    return values if where == "cpu" else values.to(device)
