"""The interposed torch.distributed entry points pass on only what the installed torch takes."""

from __future__ import annotations

import functools

import torch.distributed.distributed_c10d as c10d

from prism.capture.interpose import taken_by


def _new_group_of_torch_2_11(ranks=None, timeout=None, backend=None, pg_options=None,
                             use_local_synchronization=False, group_desc=None, device_id=None):  # fmt: skip
    return ranks


def test_an_older_new_group_gets_no_argument_it_does_not_take():
    # torch 2.11's DeviceMesh calls new_group without sort_ranks, and 2.11's new_group refuses it
    asked = taken_by(_new_group_of_torch_2_11, ranks=[0, 1], group_desc="tp", sort_ranks=True)
    assert asked == {"ranks": [0, 1], "group_desc": "tp"}
    assert _new_group_of_torch_2_11(**asked) == [0, 1]


def test_the_installed_new_group_is_read_through_its_logging_wrapper():
    # c10d's new_group is wrapped (functools.wraps) by torch's logger: its own parameters count
    logged = functools.wraps(_new_group_of_torch_2_11)(lambda *a, **k: _new_group_of_torch_2_11(*a, **k))
    assert set(taken_by(logged, sort_ranks=True, ranks=None)) == {"ranks"}
    assert "sort_ranks" in taken_by(c10d.new_group, sort_ranks=True)  # the torch prism pins takes it
