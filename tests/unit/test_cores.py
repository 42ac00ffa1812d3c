"""Cores for the replayed ranks and the co-simulation: each rank its own, the launcher the rest."""

from __future__ import annotations

import os

import pytest

from prism.replay.cores import can_pin, launcher_on, plan_cores


def test_each_rank_gets_cores_of_its_own_and_the_launcher_the_rest() -> None:
    plan = plan_cores(2, 3, available={0, 1, 2, 3, 4, 5, 6, 7})
    assert plan is not None
    assert plan.ranks == (frozenset({0, 1, 2}), frozenset({3, 4, 5}))
    assert plan.launcher == frozenset({6, 7})
    assert plan.to_dict() == {"ranks": [[0, 1, 2], [3, 4, 5]], "launcher": [6, 7]}


def test_the_cores_this_process_may_use_are_the_ones_shared_out() -> None:
    # A machine whose process may run on a few of its cores only (a container's cpuset).
    plan = plan_cores(1, 1, available={5, 9})
    assert plan is not None and plan.ranks == (frozenset({5}),) and plan.launcher == frozenset({9})


@pytest.mark.parametrize(("ranks", "threads", "cores"), [(1, 1, 1), (2, 1, 2), (1, 2, 2), (3, 4, 12)])
def test_nothing_is_pinned_without_a_core_left_for_the_launcher(ranks: int, threads: int, cores: int) -> None:
    assert plan_cores(ranks, threads, available=set(range(cores))) is None


@pytest.mark.skipif(not can_pin(), reason="this platform cannot pin threads to cores")
def test_the_launcher_is_held_to_its_cores_and_let_go_after() -> None:
    before = os.sched_getaffinity(0)
    one = {min(before)}
    with launcher_on(frozenset(one)):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == before
    with launcher_on(None):
        assert os.sched_getaffinity(0) == before
