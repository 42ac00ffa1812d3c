"""How a rank's parameters are packed into data-parallel gradient buckets, as DDP packs them.

Declared here because a capture plans them for the program it runs and the graph builder
plans them again for a target layout it never ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """Parameters whose gradients are all-reduced together."""

    index: int
    """Position in the sync order."""
    params: tuple[int, ...]
    """Indices into the parameter list, in packing order."""
    numel: int
    """Elements of the flat buffer."""


def plan_buckets(
    sizes_bytes: Sequence[int], numels: Sequence[int], bucket_bytes: int, first_bucket_bytes: int = 0
) -> list[Bucket]:
    """Pack parameters (given by size, in registration order) into buckets, last parameter first.

    As DDP does: the last layers' gradients are ready first. A bucket closes once it reaches
    the cap (the first one ``first_bucket_bytes``, where given), so a parameter larger than the
    cap gets a bucket of its own.
    """
    buckets: list[Bucket] = []
    current: list[int] = []
    filled = 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        filled += sizes_bytes[i]
        if filled >= (first_bucket_bytes if first_bucket_bytes and not buckets else bucket_bytes):
            buckets.append(
                Bucket(index=len(buckets), params=tuple(current), numel=sum(numels[j] for j in current))
            )
            current, filled = [], 0
    if current:
        buckets.append(
            Bucket(index=len(buckets), params=tuple(current), numel=sum(numels[j] for j in current))
        )
    return buckets
