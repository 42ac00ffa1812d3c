"""Real calls matched across their members' comm logs: latency after the last arrival, and skew."""

from __future__ import annotations

import dataclasses

import numpy as np

from prism.graph.comm.call_latency import call_latencies, clean_call_mask, post_times, transfer_times
from prism.schemas.comm_log import CommCall, CommLog


def _call(
    seq: int, op: str, enter: int, done: int, *, gseq: int = 0, peer: int | None = None, delegated=True
):
    return CommCall(
        seq=seq, op=op, group="g", label="tp", group_size=2, gseq=gseq, bytes=4096, dtype="float32",
        shape=(1024,), peer=peer, enter_ns=enter, exit_ns=enter, done_ns=done, delegated=delegated,
    )  # fmt: skip


def _log(rank: int, *calls: CommCall) -> CommLog:
    return CommLog(rank=rank, world_size=2, calls=calls)


def test_a_collective_costs_from_its_last_arrival_not_from_each_members_entry() -> None:
    # Rank 0 arrives at 100 and waits for rank 1 (arrives 400); both done at 900 and 950.
    (only,) = call_latencies([(_log(0, _call(0, "all_reduce", 100, 900)), None),
                              (_log(1, _call(0, "all_reduce", 400, 950)), None)])  # fmt: skip
    assert (only.op, only.group_size, only.bytes) == ("all_reduce", 2, 4096)
    assert only.skew_ns == 300 and only.latency_ns == 550  # not rank 0's 800


def test_instances_are_matched_by_group_sequence_and_transfers_by_their_order_per_pair() -> None:
    rank0 = _log(
        0,
        _call(0, "all_reduce", 0, 10, gseq=0),
        _call(1, "send", 20, 25, peer=1),
        _call(2, "send", 40, 48, peer=1),
        _call(3, "all_reduce", 60, 70, gseq=1),
    )
    rank1 = _log(
        1,
        _call(0, "all_reduce", 5, 12, gseq=0),
        _call(1, "recv", 18, 30, peer=0),
        _call(2, "all_reduce", 61, 75, gseq=1),
        _call(3, "recv", 35, 50, peer=0),
    )
    got = sorted((c.op, c.skew_ns, c.latency_ns) for c in call_latencies([(rank0, None), (rank1, None)]))
    # Transfers: (send 20, recv 18) -> from 20 to 30; (send 40, recv 35) -> from 40 to 50.
    assert got == [("all_reduce", 1, 14), ("all_reduce", 5, 7), ("send", 2, 10), ("send", 5, 10)]


def test_incomplete_virtual_and_masked_calls_are_left_out() -> None:
    rank0 = _log(
        0,
        _call(0, "all_reduce", 0, 10, gseq=0),  # the one complete instance
        _call(1, "all_reduce", 20, 30, gseq=1, delegated=False),  # timed by a clock, not a network
        _call(2, "all_reduce", 40, 50, gseq=2),  # masked out below
        _call(3, "all_reduce", 60, 0, gseq=3),  # never completed
    )
    rank1 = _log(1, *(_call(i, "all_reduce", 10 * i, 10 * i + 5, gseq=i) for i in range(4)))
    (only,) = call_latencies([(rank0, np.array([True, True, False, True])), (rank1, None)])
    assert (only.skew_ns, only.latency_ns) == (0, 10)  # gseq 0, the one instance both ranks made for real
    # Only one member's log: nothing is complete.
    assert call_latencies([(_log(0, _call(0, "all_reduce", 0, 10)), None)]) == []


def test_clean_call_mask_keeps_the_clean_unprofiled_iterations() -> None:
    # 2 set-up calls, then 3 calls in each of 5 iterations; warm-up 4: iterations 1 and 2 are
    # clean (0 is cold, 3 is the profiler's warm-up step, 4 is profiled).
    mask = clean_call_mask(2 + 3 * 5, 5, 4)
    assert mask.tolist() == [False] * 5 + [True] * 6 + [False] * 6
    # Logs that do not split into equal iterations keep every call.
    assert clean_call_mask(7, 5, 4).all() and clean_call_mask(3, 5, 4).all()


def test_clean_call_mask_finds_the_iterations_by_the_calls_they_repeat() -> None:
    # A tensor-parallel program's set-up scatters its weights in as many calls as it runs
    # iterations (4), then makes 3 all-reduces and one small one an iteration: split evenly, the
    # log would read as 5 calls an iteration and no set-up.
    iteration = [("all_reduce", "tp.0", 131072, None)] * 3 + [("all_reduce", "tp.0", 56, None)]
    signatures = [("scatter", "tp.0", 32768, None)] * 4 + iteration * 4
    mask = clean_call_mask(len(signatures), 4, 3, signatures)
    assert mask.tolist() == [False] * 8 + [True] * 4 + [False] * 8  # iteration 1 alone is clean
    assert clean_call_mask(len(signatures), 4, 3).tolist() == [False] * 5 + [True] * 5 + [False] * 10
    # Every iteration's calls alike, and set-up calls (eight) dividing evenly into one more call
    # an iteration: the split under which all five iterations repeat wins.
    alike = [("scatter", "tp.0", 8192, None)] * 8 + [("all_reduce", "tp.0", 2048, None)] * 20
    assert clean_call_mask(28, 5, 4, alike).tolist() == [False] * 12 + [True] * 8 + [False] * 8
    # Iterations that never repeat fall back to the even split.
    varied = [("all_reduce", "tp.0", n, None) for n in range(20)]
    assert clean_call_mask(20, 4, 3, varied).tolist() == clean_call_mask(20, 4, 3).tolist()


def _posted(seq: int, op: str, enter: int, exit: int, wait: int, done: int, peer: int) -> CommCall:
    posted = _call(seq, op, enter, done, gseq=seq, peer=peer)
    return dataclasses.replace(posted, bytes=65536, async_op=True, exit_ns=exit, first_wait_ns=wait)


def test_a_transfers_time_splits_into_posts_the_receivers_own_work_and_its_blocked_wait() -> None:
    # Rank 0 posts its send at 100-250 and waits; rank 1 posts its recv at 400-550 (last), does
    # its own work, waits from 700 and has the data at 710: 310 after the later post, 10 blocked.
    sender = _log(0, _posted(0, "send", 100, 250, 260, 650, peer=1))
    receiver = _log(1, _posted(0, "recv", 400, 550, 700, 710, peer=0))
    (only,) = transfer_times([(sender, None), (receiver, None)])
    assert (only.source, only.dest, only.bytes) == (0, 1, 65536)
    assert (only.send_post_ns, only.recv_post_ns) == (150, 150)
    assert only.receiver_last and only.latency_ns == 310 and only.blocked_ns == 10
    # Waiting before the sender posted: blocked from the later post on.
    early = _log(1, _posted(0, "recv", 50, 60, 70, 400, peer=0))
    (waiting,) = transfer_times([(sender, None), (early, None)])
    assert not waiting.receiver_last and waiting.blocked_ns == 300 and waiting.latency_ns == 300
    # One end missing, or kept out by the mask: no transfer.
    assert transfer_times([(sender, None)]) == []
    assert transfer_times([(sender, None), (receiver, np.zeros(1, np.bool_))]) == []


def test_posts_of_real_and_virtual_transfers_alike_and_only_asynchronous_ones() -> None:
    # A slice's rank posts to a virtual peer (not delegated) as a real run's posts on gloo: both
    # are read, each with its side, so that the two can be set beside each other.
    virtual = dataclasses.replace(_posted(0, "send", 100, 130, 140, 150, peer=1), delegated=False)
    real = _posted(1, "recv", 200, 290, 300, 400, peer=1)
    blocking = dataclasses.replace(_posted(2, "send", 500, 900, 0, 900, peer=1), async_op=False)
    no_peer = dataclasses.replace(_posted(3, "recv", 950, 960, 0, 990, peer=1), peer=None)
    log = _log(0, virtual, real, blocking, no_peer)
    posts = post_times([(log, None)])
    assert [(p.op, p.peer, p.delegated, p.post_ns) for p in posts] == [
        ("send", 1, False, 30),
        ("recv", 1, True, 90),
    ]
    assert post_times([(log, np.array([False, True, True, True]))]) == posts[1:]
