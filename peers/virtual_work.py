"""The Work of a virtual call, and how it completes at the time its clock names.

A virtual call completes at a wall time (``prism.peers.clock``). Two things may complete it:
the scheduler thread when that time comes (``prism.peers.scheduler``), for a call whose future
was handed out (to a callback, or to C++ that waits on it), or else the program's own thread
when it looks at the call: in ``wait()``, which sleeps until the time itself, or in
``is_completed()`` once the time has passed. Scheduling is kept to futures someone holds: waking
the scheduler thread costs the program's thread tens of µs on a busy machine, at every call.
Once the program waits, only it completes the call: a time named while
it waits (by the co-simulation's thread, or the coordinator's connection when several ranks
are real) wakes it, and it completes the call itself. Either way the completion lets go of the
call's tensors *before* it hands them to the future, so that the program's thread, which holds
the Work, drops the last reference: the profiler records allocator frees on the thread that
makes them, and frees on a helper thread would be missing from the trace (a rank would seem to
hold memory it had freed). A helper thread completing a call the program waits on would hold
the tensors in its frame while the woken program drops its own references, and those frees
would go missing too.

A capture also notes where its program blocked on a call without asking prism (C++ waiting on
the call's future: DDP's reducer at the end of ``backward()``): the future was handed out and
never waited on from Python, and when the call completes the thread that took the future has
slept for a while (``prism.peers.thread_sleep``). The call's record then says the program
waited from that long before the completion (``wait_ns`` and ``first_wait_ns``), as a wait the
program made itself does: the build takes that hold out of the program's own time and puts the
call's wait node there.
"""

from __future__ import annotations

import threading
import time
import weakref
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from prism.peers import thread_sleep
from prism.peers.clock import PendingCall
from prism.peers.recorder import CallRecord
from prism.peers.scheduler import SCHEDULER

_SPIN_NS = 1_000_000
"""The last stretch before a completion is spun, not slept (see ``sleep_until_due``)."""
MIN_UNSEEN_WAIT_NS = 100_000
"""How long before a call's completion the thread that took its future must have begun to sleep
for a wait to be noted: shorter sleeps are the thread's own (a lock, the interpreter's)."""


class VirtualCompletion:
    """Completes one virtual call's future once: at the clock's time, or fails it at the timeout."""

    __slots__ = (
        "_record",
        "_future",
        "_result",
        "_due",
        "_lock",
        "_settled",
        "_waited",
        "_observed",
        "_named",
        "_spin",
        "_note_unseen",
        "_taken",
        "__weakref__",
    )

    def __init__(
        self, record: CallRecord, future: torch.futures.Future, result: object, *, spin: bool = True,
        note_unseen_waits: bool = False,
    ) -> None:  # fmt: skip
        self._record, self._future, self._result = record, future, result
        self._spin = spin  # keep the named time to the µs (``CommClock.keeps_time``)
        self._note_unseen = note_unseen_waits  # a capture's: see the module's docstring
        self._taken: thread_sleep.SleepProbe | None = None  # the counters of the thread that took the future
        self._due: int | None = None
        self._lock = threading.Lock()
        self._settled = False  # a time was named (or the call failed): the timeout no longer applies
        self._waited = False  # the program waits in ``sleep_until_due``: it completes the call
        self._observed = False  # the future was handed out: the scheduler completes it on time
        # Released once, with ``_settled``: a held lock is the cheapest one-shot signal (an Event's
        # set() costs the program's thread more, at every call).
        self._named = threading.Lock()
        self._named.acquire()

    @property
    def settled(self) -> bool:
        return self._settled

    @property
    def due_ns(self) -> int | None:
        """The wall time the clock named for the call (None: not named yet, or at once)."""
        return self._due

    def at(self, due_ns: int | None) -> None:
        """The clock's answer: complete at ``due_ns`` (now if None or past)."""
        with self._lock:
            if self._settled:
                return
            self._settled, self._due = True, due_ns
            waited = self._waited
        self._named.release()
        if waited:
            return  # the waiting program completes it
        if due_ns is None or due_ns <= time.time_ns():
            self._complete_unless_waited()
        elif self._observed:
            SCHEDULER.schedule(due_ns, self._complete_unless_waited)
        # else: the program completes it when it waits, polls, or asks for the future

    def observe(self) -> None:
        """The call's future is handed out: it must complete on time without the program."""
        with self._lock:
            if self._observed:
                return
            self._observed = True
            if self._note_unseen:
                self._taken = thread_sleep.probe()
            due, scheduled = self._due, self._settled and not self._waited and self._future is not None
        if scheduled:  # named already, not yet completed
            if due is None or due <= time.time_ns():
                self._complete_unless_waited()
            else:
                SCHEDULER.schedule(due, self._complete_unless_waited)

    def complete_if_due(self) -> None:
        """The program polls the call: complete it here if its time has come."""
        with self._lock:
            due = self._due if self._settled and not self._waited else -1
        if due is None or 0 <= due <= time.time_ns():
            self._complete_unless_waited()

    def asked(self) -> None:
        """The program calls wait() on the call's Work now: where it waits for it."""
        self._record.asked()

    def sleep_until_due(self) -> None:
        """In the waiting thread: wait until the named time and complete the call here.

        Sleeps until shortly before it, then spins: waking from a sleep takes the OS up to a
        millisecond on a loaded machine, which would come on top of a latency the comm model
        already charges (it was measured on real calls, their wake-ups included). A call whose
        clock does not keep time (a capture's hold) is slept to the end, wake-up and all, as a
        real call's wait is."""
        with self._lock:
            self._waited = True
        self._record.waiting()
        began = time.time_ns() if self._note_unseen else 0
        self._named.acquire()  # a time, or the timeout's failure
        self._named.release()  # stays open, like a set Event, for any other waiter
        if self._due is not None:
            remaining = self._due - time.time_ns()
            if remaining > _SPIN_NS or (remaining > 0 and not self._spin):
                time.sleep((remaining - (_SPIN_NS if self._spin else 0)) / 1e9)
            while time.time_ns() < self._due:
                pass
        if self._note_unseen:  # a capture's: its unseen waits are told from the thread's other sleeps
            thread_sleep.HELD.add(time.time_ns() - began)
        self.complete()

    def _complete_unless_waited(self) -> None:
        """From a helper thread: complete, unless the program waits (then it does)."""
        self.complete(unless_waited=True)

    def complete(self, *, unless_waited: bool = False) -> None:
        with self._lock:
            if unless_waited and self._waited:
                return
            future, result = self._future, self._result
            self._future = self._result = None  # from here on only the future holds the tensors
        if future is None:
            return  # already completed (or failed)
        self._record.finish(self._due)
        if unless_waited and self._taken is not None:
            self._note_unseen_wait(self._taken)
        future.set_result(result)

    def _note_unseen_wait(self, taken: thread_sleep.SleepProbe) -> None:
        """If the thread that took the future is blocked as the call completes and has slept since,
        unseen by prism, from well before the call's time, the call held it from then. (A thread
        still computing slept in short stretches, a lock or the interpreter handed to another
        thread, not on the call: noted, they would put a wait in the middle of DDP's backward,
        where the program never blocked. A sleep that began after the call's time is not a wait
        for it either: a thread that computes still hands the interpreter to the completing
        thread for a moment, and sleeps meanwhile.)"""
        record = self._record
        if record.first_wait_ns:
            return
        slept = thread_sleep.slept_since(taken)
        if slept is None or not thread_sleep.blocked(taken.tid):
            return
        now, ns = slept
        began = max(now - ns, taken.wall_ns)
        if record.done_ns - began >= MIN_UNSEEN_WAIT_NS:
            record.wait_ns = record.first_wait_ns = began

    def expire(self, call: PendingCall, timeout: timedelta) -> None:
        """Fail the call if its clock has named no completion time by now."""
        with self._lock:
            if self._settled or self._future is None:
                return
            self._settled = True
            future, self._future, self._result = self._future, None, None
        self._named.release()
        future.set_exception(
            TimeoutError(
                f"prism: {call.describe()} did not complete within {timeout.total_seconds():.0f} s: "
                "its virtual peers never reached it (they wait for something this rank does not do)"
            )
        )


def _expire(completion: weakref.ref, call: PendingCall, timeout: timedelta) -> None:
    alive = completion()
    if alive is not None:  # else nobody holds its Work: nobody can be waiting on it
        alive.expire(call, timeout)


def arm_timeout(completion: VirtualCompletion, call: PendingCall, timeout: timedelta) -> None:
    """Fail ``completion`` after ``timeout`` unless its clock names a time first."""
    deadline = time.time_ns() + int(timeout.total_seconds() * 1e9)
    # A weak reference: the pending timeout must not keep the call (and its tensors) alive.
    SCHEDULER.schedule(deadline, partial(_expire, weakref.ref(completion), call, timeout))


class VirtualWork(dist.Work):
    """The Work of a virtual call: done when its future is; ``wait`` raises if the call failed.

    (A Work made by ``_create_work_from_future`` reports success for a future that holds an
    exception, so a timed-out call would return as if it had completed.)"""

    def __init__(self, future: torch.futures.Future, completion: VirtualCompletion) -> None:
        super().__init__()
        self._future = future
        self._completion = completion  # alive while the Work is: its timeout stays armed

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        self._completion.asked()
        if not self._future.done():
            self._completion.complete_if_due()  # its time passed while nobody looked: not a wait
        if not self._future.done():
            self._completion.sleep_until_due()
        self._future.wait()  # raises the call's error
        return True

    def is_completed(self) -> bool:
        if not self._future.done():
            self._completion.complete_if_due()
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self.exception() is None

    def exception(self):
        try:
            self._future.value()
        except Exception as error:
            return error
        return None

    def get_future(self) -> torch.futures.Future:
        self._completion.observe()
        return self._future

    def synchronize(self) -> None:
        pass
