"""The H200 capture of the built-in GPT (gpu_checks.sh step gpt_capture, run 3): its graph's
predicted peak device memory, with the static bytes from the model alone and with what each
captured rank's device held when its profiled iterations began.

    .venv/bin/python benchmarks/results/gpu_h200_2026-11-26/run3/cuda_static_check.py CAPTURE_DIR

That capture predates the capture's own reading of the held bytes (RankResult.static_bytes on
CUDA), so it is read here from the trace: the allocator's total just before the profiled
window's first allocation (``Total Allocated - Bytes`` of its first CUDA ``[memory]`` event).
"""

import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.io.parquet import read_metadata
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import simulate
from prism.schemas.cluster import preset

capture = Path(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    held = Path(tmp) / "cap"
    shutil.copytree(capture, held)
    manifest = json.loads((held / "manifest.json").read_text())
    measured = {}
    for rank in manifest["ranks"]:
        events = json.load(gzip.open(held / rank["kineto"]))["traceEvents"]
        cuda = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1),
                      key=lambda e: e["ts"])  # fmt: skip
        rank["result"]["static_bytes"] = cuda[0]["args"]["Total Allocated"] - cuda[0]["args"]["Bytes"]
        measured[rank["rank"]] = rank["result"]["peak_device_bytes"]
    (held / "manifest.json").write_text(json.dumps(manifest))
    for name, source in (("model's static bytes", capture), ("static bytes as the device held them", held)):
        out = Path(tmp) / f"{len(name)}.parquet"
        build_graph(BuildOptions(capture_dir=source, out=out, tp=2, pp=2, dp=4, cluster=preset("h100-ib")))
        peak = simulate(load_sim_graph(out)).peak_bytes
        print(f"{name}: stage_static_bytes {read_metadata(out).extra.get('stage_static_bytes')}")
        for rank, bytes_ in measured.items():
            print(f"  rank {rank}: predicted peak {int(peak[rank]):,} B, measured (max_memory_allocated) "
                  f"{bytes_:,} B, error {100 * (int(peak[rank]) - bytes_) / bytes_:+.3f} %")  # fmt: skip
