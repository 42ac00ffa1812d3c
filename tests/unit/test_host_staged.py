"""Members sharing one GPU exchange through host memory: what a rank receives lands in its own
tensor when it waits, and a call the staging does not carry says so."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from prism.peers.delegate import make_backend
from prism.peers.host_staged import HostStagedBackend


def _pair() -> list[HostStagedBackend]:
    """Two members of one gloo group, made together (each waits on the other in the store)."""
    store, made = dist.HashStore(), [None, None]

    def make(rank: int) -> None:
        made[rank] = HostStagedBackend(
            make_backend(
                "cpu", store=store, rank=rank, size=2, global_ranks=(0, 1), group_name="s",
                timeout=timedelta(seconds=30),
            )
        )  # fmt: skip

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made


def _together(*calls) -> list:
    results = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_a_transfer_lands_in_the_receivers_own_tensor_even_a_strided_one() -> None:
    first, second = _pair()
    sent = torch.arange(12.0).reshape(3, 4)
    into = torch.zeros(4, 3).t()  # a transposed view: the stage's buffer need not be contiguous

    def recv() -> None:
        first.recv([into], 1).wait()

    def send() -> None:
        second.send([sent], 0).wait()

    _together(recv, send)
    assert torch.equal(into, sent)
    assert torch.equal(sent, torch.arange(12.0).reshape(3, 4))  # the sender's tensor is untouched


def test_an_all_reduce_and_a_broadcast_write_each_members_tensor() -> None:
    members = _pair()
    values = [torch.full((3,), 1.0), torch.full((3,), 2.0)]
    _together(
        *[
            lambda m=m, v=v: m.allreduce([v], dist.AllreduceOptions()).wait()
            for m, v in zip(members, values, strict=True)
        ]
    )
    assert all(torch.equal(v, torch.full((3,), 3.0)) for v in values)

    options = dist.BroadcastOptions()
    options.rootRank = 1
    values = [torch.zeros(2), torch.tensor([5.0, 7.0])]
    _together(
        *[lambda m=m, v=v: m.broadcast([v], options).wait() for m, v in zip(members, values, strict=True)]
    )
    assert torch.equal(values[0], torch.tensor([5.0, 7.0]))


def test_a_call_the_staging_does_not_carry_names_itself() -> None:
    member = HostStagedBackend(object())
    with pytest.raises(NotImplementedError, match="not alltoall_base"):
        member.alltoall_base([], [], [], [], dist.AllToAllOptions())
    assert member.supports_coalescing is False
