"""What a collective leaves in its buffers when every peer is virtual.

Data that this rank sent to itself is real; data that would come from a virtual peer is either a
copy of this rank's own contribution (all-gather: peers of one role hold alike data), this rank's
own values left in place (a broadcast from another root: programs broadcast what every rank
already holds alike, rank 0's parameters, DDP's shape check, a seed), what this rank sent that
peer (all-to-all: every peer routes as this rank does), or stand-in values (receives, a broadcast
into a buffer that holds no finite values).
"""

from __future__ import annotations

import torch

from prism.peers.standin import fill_standin

__all__ = [
    "all_to_all_into",
    "fill_standin",
    "keep_own_else_standin",
    "own_chunk_into",
    "mirror_slots",
    "own_slot_else_standin",
    "replicate_into",
]


def replicate_into(output: torch.Tensor, input: torch.Tensor, group_size: int) -> None:
    """All-gather into one tensor: every member's slot gets a copy of ``input`` (one copy kernel)."""
    _check_numel(output, input.numel() * group_size, "all_gather output")
    source = input.reshape(1, -1)
    if _shares_memory(source, output):  # in-place all-gather (FSDP2): the input is the rank's own slot
        source = source.clone()
    output.view(group_size, -1).copy_(source)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def keep_own_else_standin(buffer: torch.Tensor) -> None:
    """A broadcast from a virtual root: by the layout's symmetry the root holds what this rank
    holds, so the buffer keeps its own values, unless some are not finite (an uninitialised
    receive buffer, ``torch.empty``), which would send the program down another path."""
    if (buffer.is_floating_point() or buffer.is_complex()) and not bool(torch.isfinite(buffer).all()):
        fill_standin(buffer)


def own_chunk_into(output: torch.Tensor, input: torch.Tensor, rank: int, group_size: int) -> None:
    """Reduce-scatter from one tensor: ``output`` gets this rank's own chunk of ``input``."""
    _check_numel(input, output.numel() * group_size, "reduce_scatter input")
    chunk = input.reshape(group_size, -1)[rank].view(output.shape)
    output.copy_(chunk.clone() if _shares_memory(chunk, output) else chunk)


def own_slot_else_standin(outputs: list[torch.Tensor], own: torch.Tensor, rank: int) -> None:
    """List form of gather: slot ``rank`` gets ``own``, every other slot stand-ins."""
    for slot, out in enumerate(outputs):
        if slot == rank:
            out.copy_(own)
        else:
            fill_standin(out)


def mirror_slots(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
    """List form of all-to-all, each peer mirroring this rank (``all_to_all_into``): slot j gets
    what this rank sends to j, or stand-ins where its shape is another."""
    for out, sent in zip(outputs, inputs, strict=True):
        if out.shape == sent.shape:
            out.copy_(sent)
        else:
            fill_standin(out)


def all_to_all_into(
    output: torch.Tensor,
    input: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    rank: int,
    group_size: int,
) -> None:
    """all_to_all_single, each peer mirroring this rank: a peer sends back what this rank sends it
    (routing as this rank routes, so what the rank receives equals what it sends: a mixture of
    experts' token counts give the splits it then uses). A chunk whose length is not the one sent
    there gets stand-ins."""
    outs, ins = _chunks(output, output_splits, group_size), _chunks(input, input_splits, group_size)
    if outs[rank][1] != ins[rank][1]:
        raise ValueError(
            f"all_to_all: rank {rank} sends itself {ins[rank][1]} rows but expects {outs[rank][1]}"
        )
    source = input.clone() if _shares_memory(input, output) else input
    for (out_start, out_len), (in_start, in_len) in zip(outs, ins, strict=True):
        if not out_len:
            continue
        target = output.narrow(0, out_start, out_len)
        if out_len == in_len:
            target.copy_(source.narrow(0, in_start, in_len))
        else:
            fill_standin(target)


def _chunks(tensor: torch.Tensor, splits: list[int], group_size: int) -> list[tuple[int, int]]:
    """(first row, rows) of every member's chunk along dim 0."""
    return [_split(tensor, splits, member, group_size) for member in range(group_size)]


def _split(tensor: torch.Tensor, splits: list[int], rank: int, group_size: int) -> tuple[int, int]:
    """(first row, rows) of ``rank``'s chunk along dim 0; no splits means equal chunks."""
    if splits:
        if len(splits) != group_size:
            raise ValueError(f"all_to_all: {len(splits)} split sizes for a group of {group_size}")
        return sum(splits[:rank]), splits[rank]
    if tensor.shape[0] % group_size:
        raise ValueError(
            f"all_to_all: dim 0 ({tensor.shape[0]}) is not divisible by the group size {group_size}"
        )
    rows = tensor.shape[0] // group_size
    return rank * rows, rows


def _check_numel(tensor: torch.Tensor, expected: int, what: str) -> None:
    if tensor.numel() != expected:
        raise ValueError(f"{what} has {tensor.numel()} elements, expected {expected}")
