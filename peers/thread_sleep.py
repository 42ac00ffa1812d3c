"""How long a thread slept (blocked, neither running nor waiting for a core) over a stretch of time.

A virtual call's Work can be waited on where prism does not see it: DDP's reducer waits on the
futures of its bucket all-reduces from C++, at the end of ``backward()``. A capture that holds
such a call for its price then blocks the program for part of it, and that block lands in the
trace as a gap the graph would keep as the program's own time, on top of the wait its graph
models. The kernel counts a thread's time on a core and waiting for one
(``/proc/<pid>/task/<tid>/schedstat``, ns); whatever else of a stretch of wall time it spent
asleep. Where the kernel does not give these counts (not Linux), nothing is measured and
nothing is noted. A total does not say whether the thread slept in one stretch (a block on the
call) or in many short ones (a lock, the interpreter handed to another thread): only a thread
that is blocked as the call completes (``blocked``) was waiting for it. A thread with intra-op
workers also sleeps at their barrier inside an op, for as long as they wait for a core: told
apart from a wait by nothing here, which is why a capture's rank runs one intra-op thread.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple


class SleepProbe(NamedTuple):
    """A thread's counters at one moment."""

    tid: int
    wall_ns: int
    run_ns: int
    """Time on a core plus time waiting for one, so far."""
    held_ns: int
    """Time it spent in prism's own waits so far (``HELD``): held time already, not to count twice."""


class _HeldByThread:
    """Per thread, the time it spent in waits prism sees (a virtual call's ``wait()``)."""

    def __init__(self) -> None:
        self._ns: dict[int, int] = {}

    def add(self, ns: int) -> None:
        tid = threading.get_native_id()
        self._ns[tid] = self._ns.get(tid, 0) + ns  # only the thread itself writes its entry

    def of(self, tid: int) -> int:
        return self._ns.get(tid, 0)


HELD = _HeldByThread()


def _run_ns(tid: int) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            on_cpu, waiting, _ = f.read().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) + int(waiting)


BLOCKED_CHECK_S = 50e-6
"""How long ``blocked`` watches a thread's run time, the interpreter let go meanwhile."""


def blocked(tid: int) -> bool | None:
    """Whether thread ``tid`` of this process is blocked on something other than the interpreter:
    asleep (the kernel's state S or D) before and after ``BLOCKED_CHECK_S`` with the caller's hold
    on the interpreter let go, and not run at all meanwhile. A thread waiting for the interpreter
    is woken as it is let go: it runs, or on a busy machine waits for a core (state R, its wait
    counted only once it runs); None where the kernel does not say."""
    state, before = _state(tid), _run_ns(tid)
    if state is None or before is None:
        return None
    if not state:
        return False
    time.sleep(BLOCKED_CHECK_S)  # lets go of the interpreter
    after = _run_ns(tid)
    return None if after is None else after == before and bool(_state(tid))


def _state(tid: int) -> bool | None:
    """Asleep (S or D) now; None if the thread's state cannot be read (ended, not Linux)."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 1 :].split()  # the name before it may hold spaces
    return fields[0] in (b"S", b"D") if fields else None


def probe() -> SleepProbe | None:
    """The calling thread's counters now; None where the kernel does not count them."""
    tid = threading.get_native_id()
    wall = time.time_ns()
    run = _run_ns(tid)
    return None if run is None else SleepProbe(tid, wall, run, HELD.of(tid))


def slept_since(start: SleepProbe) -> tuple[int, int] | None:
    """(now, ns the probed thread slept since ``start``, less its sleeps in prism's own waits);
    None if its counters can no longer be read (the thread ended)."""
    wall = time.time_ns()
    run = _run_ns(start.tid)
    if run is None:
        return None
    slept = (wall - start.wall_ns) - (run - start.run_ns) - (HELD.of(start.tid) - start.held_ns)
    return wall, max(slept, 0)
