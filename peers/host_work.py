"""The host-side work of a rank's virtual collectives, done for real beside its program.

A gloo collective on CPU is not only a wait: each member's process copies and reduces the
payload on gloo's own threads while the call runs, on the same cores as the program's compute
(``ClusterSpec.host_ns_per_byte``, measured by ``prism-calibrate``: about 0.4 ns a byte of an
all-reduce on a 2-vCPU VM, 70-75 % of the call's time). A virtual call does none of that work,
so a rank whose backward overlaps its gradient all-reduces (DDP's buckets) computes beside idle
cores where the real job's competed: in a capture, whose graph then predicts it short, and in
a replay.

Where the rank's job names the table (``RankJob.host_ns_per_byte``), ``HostWork`` does that much
CPU work for each of the rank's virtual collectives (``prism.peers.process_group``) on one thread of
its own: sums streamed through a buffer of the payload's size (up to ``BUFFER_BYTES``), from the
call until the work is done or the call's modelled end has passed, as gloo's threads work only
while the call runs; a call whose clock completes it at once (a capture's) completes when its work
is done. Its buffers are numpy arrays, outside torch's allocator: the rank's measured
memory is the program's. On GPUs NCCL's work is on the device, and the replay does none of this.

A call's work is one compiled loop (``_stream``) that reads the clocks itself and never holds the
interpreter lock, as gloo's threads never take it. A Python loop between chunks took the lock
back after every chunk, and the program's thread waited for it: beside a rank on the other core,
0.79 ms of such work an iteration lengthened the program's by 1.14 ms, compiled by 0.77 ms
(medians of 10 interleaved repeats, ``benchmarks/results/host_work_gil.txt``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from prism.schemas.manifest import RankJob

BUFFER_BYTES = 16 * 2**20
"""Largest stretch of memory the work streams through (a DDP bucket is about 25 MB)."""
CHUNK_BYTES = 2**18
"""Work between two looks at the clocks: about 25-50 µs here."""
MIN_WORK_NS = 200_000
"""Work below this is not done: waking the thread for it would cost the program's thread a
good part of it (tens of µs on this VM), and gloo's fixed per-call costs are not modelled."""


class _Task(NamedTuple):
    work_ns: int
    nbytes: int
    """Of the buffer the work streams through."""
    until_ns: int | None
    then: Callable[[], None] | None


class HostWork:
    """Does ``host_ns_per_byte[class] × bytes`` of CPU work for each virtual collective it is given."""

    def __init__(self, ns_per_byte: Mapping[str, float]) -> None:
        self.ns_per_byte = dict(ns_per_byte)
        self.asked_ns = 0
        """Work asked so far (calls of at least ``MIN_WORK_NS``)."""
        self.done_ns = 0
        """CPU time of the work done so far (the thread's own clock)."""
        self._tasks: collections.deque[_Task] = collections.deque()
        self._cond = threading.Condition()
        self._a = np.ones(BUFFER_BYTES // 4, dtype=np.float32)
        self._b = np.zeros_like(self._a)
        _stream(self._a, self._b, 1, 1, 0, 0)  # compiled (or loaded) now, not at the first call
        threading.Thread(target=self._run, name="prism-host-work", daemon=True).start()

    @classmethod
    def of_table(cls, ns_per_byte: Mapping[str, float]) -> HostWork | None:
        """The host work of a spec's ``host_ns_per_byte`` table; None if it names none."""
        return cls(ns_per_byte) if any(v > 0 for v in ns_per_byte.values()) else None

    def work_ns(self, op: str, nbytes: int) -> int:
        """CPU time a call of ``op`` with ``nbytes`` of this rank's costs its host (0: none modelled)."""
        # A collective's comm-log op is its spec class (``peers.comm_model.op_class``); send and
        # recv ('p2p') are not in the table.
        return int(self.ns_per_byte.get(op, 0.0) * nbytes)

    def start(
        self, op: str, nbytes: int, until_ns: int | None, then: Callable[[], None] | None = None
    ) -> int:
        """Begin the work of a call made now, to stop by ``until_ns`` (``time.time_ns()``) at the
        latest (None: when the work is done); returns the work asked (0: none, and ``then`` is
        not called). ``then`` is called on the work's thread once the work stopped."""
        work = self.work_ns(op, nbytes)
        if work < MIN_WORK_NS:
            return 0
        with self._cond:
            self._tasks.append(_Task(work, min(nbytes, BUFFER_BYTES), until_ns, then))
            self._cond.notify()
        self.asked_ns += work
        return work

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._tasks:
                    self._cond.wait()
                task = self._tasks.popleft()
            self._do(task.work_ns, task.nbytes, task.until_ns)
            if task.then is not None:
                task.then()

    def _do(self, work_ns: int, nbytes: int, until_ns: int | None) -> None:
        elements = max(nbytes // 4, 1)
        self.done_ns += _stream(self._a, self._b, elements, CHUNK_BYTES // 4, work_ns, until_ns or 0)


# The clocks of time.time_ns and time.thread_time_ns.
_CLOCK_REALTIME, _CLOCK_THREAD_CPUTIME_ID = time.CLOCK_REALTIME, time.CLOCK_THREAD_CPUTIME_ID


@intrinsic
def _clock_ns(typingctx, clock):
    """``clock_gettime(clock)`` in ns from compiled code. Linked by name, so ``_stream`` can be
    cached; a ctypes function would be an address, which numba compiles afresh in every process
    (2 s here)."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        timespec = ir.LiteralStructType([i64, i64])
        stamp = cgutils.alloca_once(builder, timespec)
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32), timespec.as_pointer()])
        clock_gettime = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        builder.call(clock_gettime, [builder.trunc(args[0], ir.IntType(32)), stamp])
        seconds = builder.load(cgutils.gep_inbounds(builder, stamp, 0, 0))
        nanoseconds = builder.load(cgutils.gep_inbounds(builder, stamp, 0, 1))
        return builder.add(builder.mul(seconds, ir.Constant(i64, 1_000_000_000)), nanoseconds)

    return types.int64(clock), codegen


@numba.njit(nogil=True, cache=True)
def _stream(a, b, elements, chunk, work_ns, until_ns):
    """Add ``a`` into ``b`` over their first ``elements``, round and round, until this thread has
    spent ``work_ns`` of CPU time or the wall clock reaches ``until_ns`` (0: no end); returns
    the CPU time spent."""
    began = _clock_ns(_CLOCK_THREAD_CPUTIME_ID)
    at = 0
    while True:
        spent = _clock_ns(_CLOCK_THREAD_CPUTIME_ID) - began
        if spent >= work_ns or (until_ns > 0 and _clock_ns(_CLOCK_REALTIME) >= until_ns):
            return spent
        end = min(at + chunk, elements)
        b[at:end] += a[at:end]
        at = 0 if end == elements else end


def host_work_of(job: RankJob) -> HostWork | None:
    """The host work of a rank process of ``job``: on CPU, where its job names the table."""
    return HostWork.of_table(job.host_ns_per_byte) if job.device == "cpu" else None
