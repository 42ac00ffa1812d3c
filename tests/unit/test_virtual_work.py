"""A virtual call the program waits on is completed by the program's own thread.

The profiler records a free only on the thread that makes it; the thread that completes a call
holds its tensors a moment, so a helper thread completing it while the program waits could make
the last free (the program would seem to hold memory it had freed).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from prism.peers import thread_sleep
from prism.peers.recorder import CommRecorder
from prism.peers.scheduler import SCHEDULER
from prism.peers.virtual_work import VirtualCompletion, VirtualWork


def virtual_call(
    *, async_op: bool = True, note_unseen_waits: bool = False
) -> tuple[VirtualCompletion, VirtualWork, list[threading.Thread]]:
    future = torch.futures.Future()
    completed_on: list[threading.Thread] = []
    future.add_done_callback(lambda _: completed_on.append(threading.current_thread()))
    record = CommRecorder(rank=0, world_size=2).begin(
        op="all_reduce", group="0", label="dp.0", group_size=2, gseq=0, bytes=16, dtype="float32",
        shape=(4,), async_op=async_op,
    )  # fmt: skip
    completion = VirtualCompletion(record, future, [torch.zeros(4)], note_unseen_waits=note_unseen_waits)
    return completion, VirtualWork(future, completion), completed_on


def test_a_time_named_while_the_program_waits_is_completed_by_the_program() -> None:
    completion, work, completed_on = virtual_call()

    def name_the_time_later() -> None:  # as the coordinator's connection does with several real ranks
        time.sleep(0.05)  # let the program's thread enter wait() first
        completion.at(time.time_ns())  # already due

    helper = threading.Thread(target=name_the_time_later)
    helper.start()
    work.wait()
    helper.join()
    assert completed_on == [threading.main_thread()]


def test_a_time_named_before_the_wait_is_kept_by_the_waiting_program() -> None:
    completion, work, completed_on = virtual_call()
    due = time.time_ns() + 20_000_000
    completion.at(due)  # scheduled; the program waits before it is due and completes it itself
    work.wait()
    assert time.time_ns() >= due
    assert completed_on == [threading.main_thread()]


def test_a_synchronous_call_is_left_to_its_waiting_program_not_the_scheduler() -> None:
    completion, work, completed_on = virtual_call(async_op=False)
    pending = SCHEDULER.pending()
    due = time.time_ns() + 20_000_000
    completion.at(due)
    assert SCHEDULER.pending() == pending  # no helper thread wakes for it
    work.wait()
    assert time.time_ns() >= due
    assert completed_on == [threading.main_thread()]


def test_a_call_whose_future_was_handed_out_completes_at_its_time_on_the_scheduler() -> None:
    completion, work, completed_on = virtual_call()
    future = work.get_future()  # as DDP's reducer takes it, to chain its callback
    completion.at(time.time_ns() + 1_000_000)
    deadline = time.time_ns() + 5_000_000_000
    # The future is marked done before its callbacks run on the completing thread: wait for both.
    while not (future.done() and completed_on) and time.time_ns() < deadline:
        time.sleep(0.001)
    assert future.done() and completed_on and completed_on[0] is not threading.main_thread()


def test_a_call_nobody_holds_the_future_of_wakes_no_thread_and_completes_when_polled() -> None:
    completion, work, completed_on = virtual_call()
    pending = SCHEDULER.pending()
    due = time.time_ns() + 5_000_000
    completion.at(due)
    assert SCHEDULER.pending() == pending and not work.is_completed()
    time.sleep(0.01)
    assert work.is_completed()  # past its time: the poll completes it, on the program's thread
    assert completed_on == [threading.main_thread()]
    assert completion._record.done_ns == due  # the clock's time, not the poll's


def test_the_first_wait_on_a_call_is_noted_even_when_it_is_complete() -> None:
    completion, work, _ = virtual_call()
    completion.at(None)  # completed at once, as a free-running capture's calls are
    record = completion._record
    assert work.is_completed() and record.first_wait_ns == 0
    before = time.time_ns()
    work.wait()
    work.wait()
    assert before <= record.first_wait_ns <= time.time_ns()


needs_schedstat = pytest.mark.skipif(
    thread_sleep.probe() is None, reason="the kernel gives no thread run times"
)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@needs_schedstat
@pytest.mark.parametrize("note", [True, False])
def test_a_wait_on_a_handed_out_future_that_prism_does_not_see_is_noted_in_a_capture(note: bool) -> None:
    # As DDP's reducer does: take the future, compute, then block on it from C++ (here the
    # future's own wait, which VirtualWork never sees) until the scheduler completes the call.
    completion, work, _ = virtual_call(note_unseen_waits=note)
    future = work.get_future()
    taken = time.time_ns()
    completion.at(taken + 60_000_000)
    _busy(0.02)
    blocked = time.time_ns()
    future.wait()
    record = completion._record
    if not note:  # a replay's calls: the co-simulation times them, nothing to take out
        assert record.wait_ns == record.first_wait_ns == 0
        return
    assert record.first_wait_ns == record.wait_ns
    # The hold began where the thread stopped computing, not where it took the future.
    assert blocked - 10_000_000 < record.wait_ns < record.done_ns
    assert record.done_ns - record.wait_ns > 25_000_000


@needs_schedstat
def test_a_handed_out_future_that_completes_while_its_thread_computes_notes_no_wait() -> None:
    completion, work, _ = virtual_call(note_unseen_waits=True)
    future = work.get_future()
    completion.at(time.time_ns() + 20_000_000)
    deadline = time.time_ns() + 5_000_000_000
    while not future.done() and time.time_ns() < deadline:
        _busy(0.005)  # the call completes meanwhile, on the scheduler
    _busy(0.01)
    assert future.done()
    assert completion._record.wait_ns == completion._record.first_wait_ns == 0


@needs_schedstat
def test_short_sleeps_of_a_thread_that_computes_through_the_call_are_not_a_wait() -> None:
    # DDP's first bucket: the future is taken and the backward goes on; the thread sleeps now and
    # then (a lock, the interpreter), a few ms in all, but never blocks on the call. One intra-op
    # thread, as a capture's rank runs by default: with more, the thread waits at its workers'
    # barrier inside torch.mm, asleep for as long as the workers wait for a core.
    a = torch.randn(96, 96)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _compute_through_a_call(a)
    finally:
        torch.set_num_threads(threads)


def _compute_through_a_call(a: torch.Tensor) -> None:
    completion, work, _ = virtual_call(note_unseen_waits=True)
    future = work.get_future()
    taken = thread_sleep.probe()
    for _ in range(10):  # short sleeps in the call's flight, before its time is named
        time.sleep(0.001)
        _busy(0.001)
    # Named after them, as a slow machine's sleeps may run past any time named before them.
    completion.at(time.time_ns() + 20_000_000)
    deadline = time.time_ns() + 5_000_000_000
    while not future.done() and time.time_ns() < deadline:
        torch.mm(a, a)  # computing, the interpreter let go inside, as a backward does
    assert future.done() and thread_sleep.slept_since(taken)[1] > 5_000_000
    assert completion._record.wait_ns == completion._record.first_wait_ns == 0


@needs_schedstat
def test_a_thread_is_blocked_while_it_waits_and_not_while_it_computes() -> None:
    me = threading.get_native_id()
    assert thread_sleep.blocked(me) is False  # running: reading its own state
    gate = threading.Event()
    tids: list[int] = []
    waiter = threading.Thread(target=lambda: (tids.append(threading.get_native_id()), gate.wait()))
    waiter.start()
    deadline = time.time() + 5
    while (not tids or not thread_sleep.blocked(tids[0])) and time.time() < deadline:
        time.sleep(0.001)
    assert thread_sleep.blocked(tids[0]) is True
    gate.set()
    waiter.join()
    assert not thread_sleep.blocked(tids[0])  # ended (its entry may linger a moment)


@needs_schedstat
def test_a_wait_prism_sees_is_not_noted_again_as_unseen() -> None:
    # The program waits on the Work from Python: its own wait, noted as such, and the scheduler
    # leaves the completion to it.
    completion, work, _ = virtual_call(note_unseen_waits=True)
    work.get_future()
    completion.at(time.time_ns() + 30_000_000)
    before = time.time_ns()
    work.wait()
    record = completion._record
    assert before <= record.first_wait_ns <= record.wait_ns < record.done_ns


@needs_schedstat
def test_thread_sleep_counts_sleep_not_compute_and_leaves_out_prism_s_own_waits() -> None:
    taken = thread_sleep.probe()
    _busy(0.03)
    _, computing = thread_sleep.slept_since(taken)
    taken = thread_sleep.probe()
    time.sleep(0.03)
    _, sleeping = thread_sleep.slept_since(taken)
    taken = thread_sleep.probe()
    time.sleep(0.03)
    thread_sleep.HELD.add(30_000_000)  # as a held call's wait() counts its sleep
    _, held = thread_sleep.slept_since(taken)
    assert computing < 10_000_000 < 25_000_000 < sleeping
    assert held < 10_000_000
