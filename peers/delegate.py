"""Real backends behind a prism group whose members are all real processes.

The prism group keeps logging every call and forwards it to a gloo backend (CPU tensors) or an
NCCL backend (CUDA tensors) over the same members, built on the store torch handed to prism.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future


def make_backend(
    device_type: str,
    *,
    store: dist.Store,
    rank: int,
    size: int,
    global_ranks: tuple[int, ...],
    group_name: str,
    timeout: timedelta,
) -> dist.Backend:
    """A real backend of ``size`` members for tensors on ``device_type`` (collective on the members)."""
    # Each device gets its own key space so that a later NCCL rendezvous cannot collide with gloo's.
    prefixed = dist.PrefixStore(f"{device_type}/", store)
    if device_type == "cpu":
        return _gloo(prefixed, rank, size, global_ranks, group_name, timeout)
    if device_type == "cuda":
        return _nccl(prefixed, rank, size, global_ranks, group_name, timeout)
    raise NotImplementedError(f"prism delegates CPU (gloo) and CUDA (NCCL) tensors only, not {device_type!r}")


def _gloo(store, rank, size, global_ranks, group_name, timeout) -> dist.Backend:
    from torch.distributed import ProcessGroupGloo

    backend = ProcessGroupGloo(store, rank, size, timeout=timeout)
    backend.options.global_ranks_in_group = list(global_ranks)
    backend.options.group_name = group_name
    backend._set_sequence_number_for_group()  # as torch does for a gloo group
    return backend


def _nccl(store, rank, size, global_ranks, group_name, timeout) -> dist.Backend:
    # Untested here (no GPU): mirrors the NCCL branch of torch's _new_process_group_helper.
    from torch.distributed import ProcessGroupNCCL

    options = ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    options.global_ranks_in_group = list(global_ranks)
    options.group_name = group_name
    backend = ProcessGroupNCCL(store, rank, size, options)
    backend._set_sequence_number_for_group()
    return backend


def track_completion(work: dist.Work | None, on_done: Callable[[], None]) -> dist.Work | None:
    """``work`` with ``on_done`` called when it completes (when it is waited for, if it has no future)."""
    if work is None:  # NCCL inside a coalesced group: the group's Work comes at the end
        return None
    try:
        future = work.get_future()
    except RuntimeError:  # gloo send/recv: "Work::getFuture not implemented"
        return ForwardingWork([work], on_done)
    future.add_done_callback(lambda _: on_done())
    return work


def run_coalesced(
    backend: dist.Backend, device: torch.device, calls: list[Callable[[], dist.Work]]
) -> dist.Work:
    """Issue ``calls`` as one coalesced group where the backend can (NCCL), else as one combined Work."""
    if backend.supports_coalescing:
        backend._start_coalescing(device)
        for call in calls:
            call()
        return backend._end_coalescing(device)
    return combine([call() for call in calls])


def combine(works: list[dist.Work]) -> dist.Work:
    """One Work that completes when all of ``works`` have."""
    if len(works) == 1:
        return works[0]
    try:
        futures = [w.get_future() for w in works]
    except RuntimeError:  # some have no future: waiting on the result waits on each
        return ForwardingWork(works)
    return _create_work_from_future(torch.futures.collect_all(futures))


class ForwardingWork(dist.Work):
    """Real Works seen as one: waits on each, then reports completion (once)."""

    def __init__(
        self,
        works: list[dist.Work],
        on_done: Callable[[], None] | None = None,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self._works = works
        self._on_done, self._on_wait = on_done, on_wait

    def _done(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def get_future(self) -> torch.futures.Future:
        """The real Works' future (DDP's reducer waits on it, not on the Work), completion reported
        as it completes; a gloo send or recv has none and raises, as gloo's own Work does."""
        futures = [w.get_future() for w in self._works]
        future = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)

        def done(f: torch.futures.Future) -> object:
            self._done()
            return f.value()

        return future.then(done)

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self._on_wait is not None:
            self._on_wait()
        ok = all([w.wait(timeout) for w in self._works])
        self._done()
        return ok

    def is_completed(self) -> bool:
        done = all(w.is_completed() for w in self._works)
        if done:
            self._done()
        return done

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self):
        return next((e for w in self._works if (e := w.exception()) is not None), None)

    def synchronize(self) -> None:
        for w in self._works:
            w.synchronize()

    def source_rank(self) -> int:
        return self._works[0]._source_rank()

    def _source_rank(self) -> int:
        return self._works[0]._source_rank()


_INFLIGHT: Counter[int] = Counter()
"""Delegated gloo calls in flight per tensor (``Tensor._cdata``): only the last one waits."""
_INFLIGHT_LOCK = threading.Lock()

_RELEASE_WAIT_S = 0.1
"""Longest a waiter lets gloo's worker thread drop its references: microseconds usually, more on
a machine with more busy threads than cores."""


class CallerReleasesWork(ForwardingWork):
    """A gloo Work after whose wait the gloo worker thread no longer holds the call's tensors.

    gloo completes a Work on its worker thread and drops its references to the tensors there a
    moment later; a temporary the program has already let go of is then freed on that thread,
    where the profiler does not record the free, and the rank would seem to hold memory it had
    freed. ``wait`` therefore lets go of the gloo Work and waits (microseconds) until the worker
    has dropped its references, so the program's own thread makes the last free.
    """

    def __init__(
        self,
        work: dist.Work,
        payload: list[torch.Tensor],
        counts: list[int],
        on_done: Callable[[], None],
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        super().__init__([work], on_done, on_wait)
        self._payload, self._counts = payload, counts
        self._source: int | None = None
        self._released = False

    @classmethod
    def issue(
        cls,
        payload: list[torch.Tensor],
        call: Callable[[], dist.Work | None],
        on_done: Callable[[], None],
        on_wait: Callable[[], None] | None = None,
    ) -> dist.Work | None:
        """Run ``call`` (a gloo call on ``payload``) and wrap its Work (``on_wait``: told as the
        program starts waiting on it)."""
        counts = [t._use_count() for t in payload]  # references before gloo takes its own
        work = call()
        if work is None:
            return None
        with _INFLIGHT_LOCK:
            _INFLIGHT.update(t._cdata for t in payload)
        return cls(work, payload, counts, on_done, on_wait)

    def source_rank(self) -> int:
        return self._source if self._released else super().source_rank()

    def _source_rank(self) -> int:
        return self.source_rank()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        ok = super().wait(timeout)
        self._release()
        return ok

    def get_future(self) -> torch.futures.Future:
        # Whoever waits on the future (DDP's reducer, in C++) makes the last free, not this Work:
        # once it completes the tensors are no longer in flight, with nothing to wait for here.
        def settled(f: torch.futures.Future) -> object:
            self._forget_inflight()
            return f.value()

        return super().get_future().then(settled)

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            self._source = self._works[0]._source_rank()
        except RuntimeError:  # not a recv from any source
            self._source = None
        self._works = []  # our reference to the gloo Work: its tensors go with the worker's
        watched = self._forget_inflight()
        deadline = time.perf_counter() + _RELEASE_WAIT_S
        while time.perf_counter() < deadline and any(t._use_count() > n for t, n in watched):
            time.sleep(0)

    def _forget_inflight(self) -> list[tuple[torch.Tensor, int]]:
        """Take the call's tensors out of ``_INFLIGHT`` (once); those no other call has in flight,
        with their reference counts before the call."""
        # A tensor another call still has in flight keeps gloo's references past this one's:
        # that call's wait makes the last free, this one need not wait for it.
        watched = []
        with _INFLIGHT_LOCK:  # the future's callback runs on gloo's thread
            payload, counts, self._payload, self._counts = self._payload, self._counts, [], []
            for t, n in zip(payload, counts, strict=True):
                _INFLIGHT[t._cdata] -= 1
                if _INFLIGHT[t._cdata] <= 0:
                    del _INFLIGHT[t._cdata]
                    watched.append((t, n))
        return watched
