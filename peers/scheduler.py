"""Completes virtual calls at the wall time their clock chose.

One daemon thread sleeps on a heap of (due time, action) pairs: no thread per call and no busy
loop, so thousands of pending calls cost one thread and a heap entry each.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class CompletionScheduler:
    """Runs ``action()`` once the wall clock (``time.time_ns()``) reaches ``at_ns``."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties keep submission order; never compares actions
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def schedule(self, at_ns: int, action: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (at_ns, next(self._order), action))
            self._ensure_thread()
            if self._heap[0][2] is action:  # else the thread already wakes up earlier than this
                self._cond.notify()

    def pending(self) -> int:
        """Number of actions not yet run."""
        with self._cond:
            return len(self._heap)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="prism-comm-clock", daemon=True)
            self._thread.start()

    def _next_due(self) -> Callable[[], None]:
        with self._cond:
            while True:
                if not self._heap:
                    self._cond.wait()
                    continue
                wait_ns = self._heap[0][0] - time.time_ns()
                if wait_ns <= 0:
                    return heapq.heappop(self._heap)[2]
                self._cond.wait(wait_ns / 1e9)

    def _loop(self) -> None:
        while True:
            action = self._next_due()
            try:
                action()
            except Exception:  # one failing completion must not stop the clock for the others
                log.exception("prism: completing a virtual call failed")

    def _after_fork(self) -> None:
        # The thread does not survive fork; actions of the parent are not the child's.
        self._heap = []
        self._cond = threading.Condition()
        self._thread = None


SCHEDULER = CompletionScheduler()
"""The process-wide scheduler used by the prism backend."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SCHEDULER._after_fork)
