"""The process groups and pipeline neighbours of one rank.

Only this rank's own tensor- and data-parallel groups are created, with
``use_local_synchronization=True``: other ranks of the world may be virtual and never call
``new_group``. Every rank creates its TP group before its DP group, so group-local rendezvous
cannot wait in a cycle. A group of one rank is not created (nothing would be communicated on it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from prism.capture.workloads.gpt.tensor_parallel import TPGroup
from prism.schemas.layout import Coords, ParallelLayout


@dataclass(frozen=True, kw_only=True)
class ParallelState:
    """Where a rank sits in the layout and whom it talks to."""

    rank: int
    """Global rank."""
    layout: ParallelLayout
    """The whole job's layout."""
    coords: Coords
    """This rank's tp, dp and pp indices."""
    tp: TPGroup
    """Tensor-parallel group."""
    dp_group: dist.ProcessGroup | None
    """Data-parallel group; None when dp == 1."""
    prev_rank: int | None
    """Global rank of the previous pipeline stage (same tp, dp index); None on the first stage."""
    next_rank: int | None
    """Global rank of the next pipeline stage; None on the last stage."""


def _new_group(ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
    return dist.new_group(ranks=list(ranks), use_local_synchronization=True) if len(ranks) > 1 else None


def build_parallel_state(layout: ParallelLayout, rank: int) -> ParallelState:
    """Create this rank's groups (collective over each group's members only)."""
    coords = layout.coords(rank)
    tp_group = _new_group(layout.group(rank, "tp"))
    dp_group = _new_group(layout.group(rank, "dp"))
    return ParallelState(
        rank=rank,
        layout=layout,
        coords=coords,
        tp=TPGroup(rank=coords.tp, size=layout.tp, group=tp_group),
        dp_group=dp_group,
        prev_rank=layout.pipeline_prev(rank),
        next_rank=layout.pipeline_next(rank),
    )
