"""A delegated gloo call's Work hands out the real call's future (DDP's reducer waits on it)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from prism.peers import delegate
from prism.peers.delegate import CallerReleasesWork, ForwardingWork, make_backend


@pytest.fixture
def gloo() -> dist.Backend:
    store = dist.HashStore()
    return make_backend(
        "cpu", store=store, rank=0, size=1, global_ranks=(0,), group_name="t", timeout=timedelta(seconds=30)
    )


def test_the_future_of_a_delegated_all_reduce_has_its_tensors_and_reports_the_end_once(gloo) -> None:
    bucket = torch.arange(4.0)
    ends: list[int] = []
    work = CallerReleasesWork.issue([bucket], lambda: gloo.allreduce([bucket]), lambda: ends.append(1))
    assert bucket._cdata in delegate._INFLIGHT
    (result,) = work.get_future().wait()
    assert torch.equal(result, torch.arange(4.0))
    assert ends == [1]
    assert bucket._cdata not in delegate._INFLIGHT  # no longer in flight: no later wait watches it
    work.wait()  # waiting as well changes nothing
    assert ends == [1]


def test_several_works_have_one_future_and_a_transfer_has_none(gloo) -> None:
    a, b = torch.ones(2), torch.ones(3)
    work = ForwardingWork([gloo.allreduce([a]), gloo.allreduce([b])])
    values = work.get_future().wait()
    assert [v.value()[0].numel() for v in values] == [2, 3]

    class NoFuture(dist.Work):  # as gloo's send/recv Works
        def get_future(self) -> torch.futures.Future:
            raise RuntimeError("Work::getFuture not implemented.")

    with pytest.raises(RuntimeError, match="getFuture"):
        ForwardingWork([NoFuture()]).get_future()
