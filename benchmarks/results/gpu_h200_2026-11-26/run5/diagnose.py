"""Why the graph of examples/ddp.py captured on one H200 at dp=1 predicts its iteration short.

    .venv/bin/python benchmarks/results/gpu_h200_2026-11-26/run5/diagnose.py [REPEAT_DIR]

REPEAT_DIR (default: repeat0 beside this file) holds one repeat of run 5's fidelity run
(``benchmarks/fidelity.py --device cuda --dp 1``, its command in README.txt): the graph built
from its capture then and the real run's result and trace; the capture itself (its Execution
Trace gzipped) is test data, ``tests/data/cuda_captures/ddp_dp1_h200/capture``. Prints,
for each profiled iteration of the capture, the host's span, the device's busy time and the host
time of the process-group calls; then the graph's time by phase and kind, and what the build did
with the calls' host time.
"""

import gzip
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from prism.graph.build import op_table as ot
from prism.graph.build.normalize import normalize_rank
from prism.graph.traces.gpu import read_gpu_trace


def busy_ns(gpu: pd.DataFrame) -> int:
    """Union of the intervals of the device's work."""
    total, start, end = 0, None, None
    for a, b in zip(gpu.start_ns, gpu.end_ns, strict=True):
        if end is None or a > end:
            total += 0 if end is None else end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (0 if end is None else end - start)


repeat = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "repeat0"
capture = Path(__file__).parents[4] / "tests" / "data" / "cuda_captures" / "ddp_dp1_h200" / "capture"
result = json.loads((capture / "logs" / "rank0.result.json").read_text())
real = json.loads((repeat / "real" / "rank0.json").read_text())
warmup = json.loads((capture / "job.json").read_text())["warmup"]
print(f"capture, unprofiled iterations (ms): {[round(n / 1e6, 2) for n in result['iteration_ns'][1:warmup]]}")
print(f"capture, profiled iterations (ms):   {[round(n / 1e6, 2) for n in result['iteration_ns'][warmup:]]}")
print(f"real run, iterations (ms):           {[round(n / 1e6, 2) for n in real['iteration_ns'][1:]]}")

trace = read_gpu_trace(capture / "kineto" / "rank0.trace.json.gz")
events = trace.events
gpu = events[events.kind.isin(["kernel", "memcpy", "memset"])].sort_values("start_ns")
with tempfile.TemporaryDirectory() as tmp:
    unpacked = Path(tmp) / "capture"
    shutil.copytree(capture, unpacked)
    packed = unpacked / "et" / "rank0.et.json.gz"
    packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
    ops = normalize_rank(unpacked, 0)
ops["total_ns"] = ops[ot.DUR_NS] + ops[ot.GAP_NS]
print("\nprofiled iteration: host span, device busy, process-group calls' host time (ms)")
for (_, step), (iteration, units) in zip(trace.steps.iterrows(), ops.groupby(ot.ITERATION), strict=True):
    window = gpu[(gpu.start_ns >= step.start_ns) & (gpu.start_ns < step.end_ns)]
    comm = units[units[ot.IS_COMM].fillna(False).astype(bool)].total_ns.sum()
    print(
        f"  {iteration}: host {(step.end_ns - step.start_ns) / 1e6:6.2f}  device busy {busy_ns(window) / 1e6:6.2f}"
        f"  ({len(window)} kernels/copies)  calls {comm / 1e6:5.2f}"
    )

graph = pq.read_table(repeat / "graph.parquet").to_pandas()
graph = graph[graph["rank"] == 0]
by = graph.groupby(["phase", "kind"], observed=True)[["dur_ns", "gap_ns"]].sum() / 1e6
print("\ngraph of rank 0 (ms):")
print(by.round(3).to_string())
profiled = statistics.median(result["iteration_ns"][warmup:])
unprofiled = statistics.median(result["iteration_ns"][1:warmup])
comm_ms = ops[ops[ot.IS_COMM].fillna(False).astype(bool)].groupby(ot.ITERATION).total_ns.sum().mean() / 1e6
print(
    f"\ngraph iteration {(graph.dur_ns.sum() + graph.gap_ns.sum()) / 1e6:.2f} ms; role factor "
    f"{unprofiled / 1e6:.2f} / {profiled / 1e6:.2f} = {unprofiled / profiled:.3f}; the calls' host time "
    f"{comm_ms:.2f} ms an iteration (x factor {comm_ms * unprofiled / profiled:.2f} ms) is not in the graph:"
    " a collective's node takes the comm model's price (0 for a group of one)"
)
