"""Counter-based random numbers: a value is a pure function of (key, index), on any device.

splitmix64 of the element index needs no generator state, so any rank computes any slice of a
tensor (its shard of a weight, its microbatch of tokens) without materialising the rest and
without talking to other ranks. Arithmetic is int64 with wrap-around; logical right shifts are
arithmetic shifts with the sign-extended bits masked off.
"""

from __future__ import annotations

import hashlib

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``value``."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 values."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def derive_key(seed: int, name: str) -> int:
    """A 64-bit stream key for ``name`` under ``seed``; stable across processes and machines."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def splitmix64(key: int, index: torch.Tensor) -> torch.Tensor:
    """The ``index``-th output (int64 bits) of the splitmix64 stream seeded with ``key``."""
    z = (index.to(torch.int64) + 1) * _signed(_GOLDEN) + _signed(key)
    z = (z ^ _shr(z, 30)) * _signed(_MIX1)
    z = (z ^ _shr(z, 27)) * _signed(_MIX2)
    return z ^ _shr(z, 31)


def uniform(key: int, index: torch.Tensor) -> torch.Tensor:
    """Float64 uniform in [0, 1) from the top 53 bits of the hash."""
    return _shr(splitmix64(key, index), 11).to(torch.float64) * 2.0**-53


def integers(key: int, index: torch.Tensor, high: int) -> torch.Tensor:
    """Int64 in [0, high) (modulo bias is negligible for the vocabularies used here)."""
    return _shr(splitmix64(key, index), 11) % high
