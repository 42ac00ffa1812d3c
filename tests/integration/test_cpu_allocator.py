"""count_frees_on_every_thread in a process of its own (the flag lasts as long as the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prism.graph.traces.kineto import read_kineto

PROGRAM = textwrap.dedent(
    """
    import sys, threading, torch
    from prism.capture.cpu_allocator import count_frees_on_every_thread
    if sys.argv[2] == "count":
        assert count_frees_on_every_thread()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        held = [torch.empty(1 << 20, dtype=torch.uint8)]
        # The block's last reference dies on that thread. Join, not poll: list.clear() empties the
        # list before it drops the references, so an empty list does not mean the block is freed.
        freer = threading.Thread(target=held.clear)
        freer.start()
        freer.join()
        later = torch.empty(4096, dtype=torch.uint8)
    prof.export_chrome_trace(sys.argv[1])
    """
)


@pytest.mark.parametrize("count", [True, False])
def test_a_free_on_another_thread_leaves_the_total(tmp_path: Path, count: bool) -> None:
    trace = tmp_path / "trace.json"
    subprocess.run(
        [sys.executable, "-c", PROGRAM, str(trace), "count" if count else "-"], check=True, timeout=120
    )
    memory = read_kineto(trace).memory
    big = memory[memory["bytes"] == 1 << 20]
    last = memory[memory["bytes"] == 4096]
    assert len(big) == 1 and len(last) == 1
    # The 1 MiB block is freed before the 4 KiB one is allocated. Counted by the allocator, the
    # total says so; uncounted, and its address not coming back, the trace cannot know.
    assert int(last["total"].iloc[0] - big["total"].iloc[0]) == (4096 - (1 << 20) if count else 4096)
