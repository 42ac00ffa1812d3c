"""The capture's profiler records the program's memory, not its own: every block an iteration
allocates and drops is freed in the trace."""

from __future__ import annotations

import json
from pathlib import Path

from torch.nn.attention.flex_attention import create_block_mask

from prism.capture.profiling import ProfileSpec, profiled


def test_blocks_an_iteration_drops_are_freed_in_its_trace(tmp_path: Path) -> None:
    # A block mask (built by indexing with tensors) is what the profiler's shape recording held
    # on to: blocks never freed, counted in every later iteration's memory (4.3 MB an iteration
    # in torchtitan's context parallel).
    trace = tmp_path / "t.json"
    spec = ProfileSpec(warmup=1, iterations=3, kineto_path=trace, et_path=tmp_path / "et.json", cuda=False)
    with profiled(spec) as profiler:
        for _ in range(spec.warmup + spec.iterations):
            mask = create_block_mask(lambda b, h, q, kv: q >= kv, 2, 1, 256, 256, device="cpu")
            del mask
            profiler.step()
    events = json.loads(trace.read_text())["traceEvents"]
    memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    assert sum(e["args"]["Bytes"] > 0 for e in memory) > 100  # the masks' blocks were recorded
    live: dict[int, int] = {}
    for event in memory:
        address, size = event["args"]["Addr"], event["args"]["Bytes"]
        if size > 0:
            live[address] = size
        else:
            live.pop(address, None)
    assert live == {}, f"{len(live)} blocks, {sum(live.values())} bytes never freed"
