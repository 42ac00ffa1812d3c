"""What collectives with virtual peers leave in their buffers, also when input and output alias."""

from __future__ import annotations

import torch

from prism.peers.virtual_data import own_chunk_into, replicate_into


def test_all_gather_copies_the_rank_own_contribution_into_every_slot() -> None:
    output = torch.zeros(4, 3)
    replicate_into(output, torch.tensor([1.0, 2.0, 3.0]), 4)
    assert torch.equal(output, torch.tensor([[1.0, 2.0, 3.0]] * 4))


def test_an_in_place_all_gather_whose_input_is_its_own_slot() -> None:
    # FSDP2 gathers into one buffer whose rank-th slot is the input itself.
    output = torch.zeros(4, 3)
    output[2] = torch.tensor([7.0, 8.0, 9.0])
    replicate_into(output, output[2], 4)
    assert torch.equal(output, torch.tensor([[7.0, 8.0, 9.0]] * 4))


def test_reduce_scatter_keeps_the_rank_own_chunk_also_in_place() -> None:
    data = torch.arange(8.0)
    out = torch.zeros(2)
    own_chunk_into(out, data, 1, 4)
    assert torch.equal(out, torch.tensor([2.0, 3.0]))
    own_chunk_into(data[2:4], data, 1, 4)  # output is the input's own chunk
    assert torch.equal(data[2:4], torch.tensor([2.0, 3.0]))
