"""The value pass of a pipelined program: values its stages send each other, recorded once.

Pipeline stages look at some of what they receive (torch.distributed.pipelining votes on static
or dynamic shapes, then sends the shapes themselves as pickled objects). A rank captured alone
would receive stand-in data from its virtual neighbours instead. So before the captured ranks
run alone, the ranks of one pipeline (tp 0, dp 0, every stage) run together, unprofiled, through
the first optimizer step, and each writes what it received from its neighbours
(``prism.peers.received_values``). A rank captured alone then gets those values for the same
receives, its pipeline's ranks mapped to the recorded pipeline's by stage.
"""

from __future__ import annotations

from pathlib import Path

from prism.peers.received_values import ReceivedValues
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import CaptureFiles
from prism.schemas.received_values import (
    Received,
    read_received_values,
    value_pass_rank,
    write_received_values,
)


def value_pass_ranks(layout: ParallelLayout) -> tuple[int, ...]:
    """The ranks that run together in the value pass: one pipeline, every stage."""
    return tuple(value_pass_rank(layout, stage) for stage in range(layout.pp))


def needs_value_pass(layout: ParallelLayout) -> bool:
    """Whether stages exist that receive from one another."""
    return layout.pp > 1


def write_values(files: CaptureFiles, rank: int, received: ReceivedValues) -> Path:
    path = files.values(rank)
    write_received_values(path, rank, received.recorded())
    return path


def known_values(files: CaptureFiles, layout: ParallelLayout, rank: int) -> ReceivedValues | None:
    """What ``rank`` receives from its pipeline neighbours, from the value pass; None without one."""
    path = files.values(value_pass_rank(layout, layout.stage(rank)))
    if not path.is_file():
        return None
    _, received = read_received_values(path)
    return ReceivedValues(_onto_pipeline_of(layout, received, rank))


def _onto_pipeline_of(layout: ParallelLayout, received: Received, rank: int) -> Received:
    """Receives recorded from the value pass's pipeline, keyed by the same stages of ``rank``'s."""
    return {
        layout.in_pipeline(rank, layout.stage(peer)): receives
        for peer, receives in received.items()
        if layout.same_pipeline(peer, value_pass_rank(layout, 0))
    }
