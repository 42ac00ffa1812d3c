"""Make the CPU allocator's running total count the frees of every thread.

The profiler reports a free only on a thread it profiles, and the CPU allocator keeps its
``Total Allocated`` only for the frees it reports: a block the training thread allocated and a
gloo worker freed (a collective's tensor dropped when its work completes) stays in the total for
the rest of the trace. c10's ``caffe2_report_cpu_memory_usage`` flag makes the allocator count
every allocation and free, whatever the thread, so each recorded event's total is what the
process holds then. The flag has no Python binding; it is an exported C symbol of libc10.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FLAG = "FLAGS_caffe2_report_cpu_memory_usage"


def count_frees_on_every_thread() -> bool:
    """Turn the flag on for the rest of the process; False (and a warning) where this torch's
    libc10 does not export it, in which case readers restore the missed frees from the events'
    addresses instead (``prism.graph.traces.kineto.restore_unrecorded_frees``).

    Call it before profiling starts: a block allocated before counts nowhere, as without it. Each
    CPU allocation then takes a lock and a table entry, so call it only where time is not measured.
    """
    library = Path(torch.__file__).parent / "lib" / "libc10.so"
    try:
        ctypes.c_bool.in_dll(ctypes.CDLL(str(library)), FLAG).value = True
    except (OSError, ValueError) as e:
        log.warning(
            "cannot count frees on every thread (%s); peaks may run high by blocks other threads free", e
        )
        return False
    return True
