# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A GPU rank's trace: HTA's breakdowns and prism's dependencies
#
# A captured GPU rank, or any `torch.profiler` trace with CUDA activities: HolisticTraceAnalysis'
# temporal breakdown (idle, compute, non-compute time), kernel breakdown (computation,
# communication, memory, and what overlaps) and communication/computation overlap; then what
# prism reads from the same trace (launches, stream order, stream waits, syncs, each NCCL
# kernel's collective) and one step of the rank's timeline simulated from those dependencies
# against the step as recorded (docs/gpu-traces.md).
#
# Set `TRACE_DIR` to a directory of one or more ranks' Kineto traces (a `--device cuda` capture's
# `kineto/` directory, or your own job's). By default: rank 0 of a 2-rank NCCL DDP training run on
# A100s, from HTA's public test data (`tests/data/gpu_traces`, MIT licence).

# %%
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prism.graph.traces.gpu import GPU_KINDS, EdgeKind, EventKind, read_gpu_trace
from prism.graph.traces.gpu_timeline import simulate_timeline, step_times

FIGURES = Path(os.environ.get("PRISM_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
ROOT = Path.cwd() if (Path.cwd() / "tests").is_dir() else Path.cwd().parent
sample = ROOT / "tests" / "data" / "gpu_traces" / "nccl_ddp_rank0.json.gz"
trace_dir = Path(os.environ.get("TRACE_DIR", "")) if os.environ.get("TRACE_DIR") else None
if trace_dir is None:  # HTA reads a directory: the sample alone in one
    workspace = tempfile.TemporaryDirectory(prefix="prism-gpu-trace-")  # removed when the kernel exits
    trace_dir = Path(workspace.name)
    shutil.copy(sample, trace_dir / sample.name)
trace_files = sorted(trace_dir.glob("*.json*"))
print(f"{len(trace_files)} trace(s) in {trace_dir}")

# %% [markdown]
# ## HTA: where each rank's GPU time goes

# %%
from hta.trace_analysis import TraceAnalysis  # noqa: E402

logging.getLogger("hta").setLevel(logging.ERROR)
with warnings.catch_warnings():  # HTA 0.5 under pandas 2 warns on its own code
    warnings.simplefilter("ignore")
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    temporal = analysis.get_temporal_breakdown(visualize=False)
    kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=5)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
print(
    temporal[["rank", "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"]].to_string(index=False)
)
print(kernel_types.to_string(index=False))
print(overlap.to_string(index=False))

# %% [markdown]
# ## prism: the dependencies, and the steps simulated from them

# %%
trace = read_gpu_trace(trace_files[0])
timeline = simulate_timeline(trace)
edges = timeline.edges
steps = step_times(trace, timeline)
print(edges["kind"].value_counts().to_string())
print(
    f"fitted delays: launch {timeline.model.launch_ns / 1e3:.1f} µs, stream {timeline.model.stream_ns / 1e3:.1f} µs"
)
print(steps.round(3).to_string(index=False))

# %%
fig, axes = plt.subplots(2, 2, figsize=(13, 8.5), gridspec_kw={"height_ratios": [1, 1.3]})
ax = axes[0, 0]
parts = [("idle_time_pctg", "idle", "#d9d9d9"), ("compute_time_pctg", "compute", "#4c72b0"),
         ("non_compute_time_pctg", "non-compute (comm, memory)", "#dd8452")]  # fmt: skip
left = 0.0
for column, label, color in parts:
    value = float(temporal[column].iloc[0])
    ax.barh([f"rank {int(temporal['rank'].iloc[0])}"], [value], left=left, height=0.5, color=color,
            label=f"{label} {value:.1f} %")  # fmt: skip
    left += value
ax.set_xlim(0, 100)
ax.set_xlabel("% of the traced GPU time")
ax.set_title("HTA temporal breakdown")
ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)

ax = axes[0, 1]
ax.barh(kernel_types["kernel_type"], kernel_types["percentage"], color="#55a868")
ax.invert_yaxis()
ax.set_xlabel("% of kernel time")
ax.set_title(f"HTA kernel breakdown (comm/comp overlap {float(overlap.iloc[0, 1]):.1f} %)")
ax.tick_params(axis="y", labelsize=8)

# One step's lanes, as recorded and as simulated: CPU threads' runtime calls and GPU streams' events.
step = trace.steps.iloc[0]
ev = trace.events
in_step = (ev["start_ns"] >= step.start_ns) & (ev["start_ns"] < step.end_ns)
lanes = ev[in_step & ev["kind"].isin([EventKind.RUNTIME.value, *[k.value for k in GPU_KINDS]])]


def color(row) -> str:
    if row.kind == EventKind.RUNTIME.value:
        return "#8172b2"
    if row.name.startswith("nccl"):
        return "#c44e52"
    return "#4c72b0" if row.kind == EventKind.KERNEL.value else "#937860"


ax = axes[1, 0]
labels = []
busy = lanes.groupby(["tid", "device", "stream"], sort=False).filter(
    lambda lane: len(lane) > 1
)  # skip stray threads
for y, ((tid, device, stream), lane) in enumerate(busy.groupby(["tid", "device", "stream"], sort=False)):
    labels.append(f"CPU thread {tid}" if stream < 0 else f"GPU {device} stream {stream}")
    for offset, (starts, ends) in enumerate([
        (lane["start_ns"], lane["end_ns"]),
        (timeline.start_ns[lane.index], timeline.end_ns[lane.index]),
    ]):  # fmt: skip
        bars = [
            ((s - step.start_ns) / 1e6, max((e - s) / 1e6, 0.01)) for s, e in zip(starts, ends, strict=True)
        ]
        ax.broken_barh(
            bars, (y - 0.4 + offset * 0.42, 0.38), facecolors=[color(r) for r in lane.itertuples()]
        )
ax.set_yticks(range(len(labels)), labels, fontsize=8)
ax.set_xlabel(f"ms into ProfilerStep#{int(step.step)} (each lane: recorded above, simulated below)")
ax.set_title("one step: runtime calls (purple), kernels (blue), NCCL (red), copies (brown)")

ax = axes[1, 1]
x = range(len(steps))
ax.bar([i - 0.2 for i in x], steps["gpu_recorded_ms"], width=0.4, label="recorded", color="#4c72b0")
ax.bar([i + 0.2 for i in x], steps["gpu_simulated_ms"], width=0.4, label="simulated", color="#dd8452")
for i, row in enumerate(steps.itertuples()):
    ax.annotate(f"{row.gpu_err_pct:+.3f} %", (i, row.gpu_recorded_ms), ha="center", va="bottom", fontsize=8)
ax.set_xticks(list(x), [f"step {int(s)}" for s in steps["step"]])
ax.set_ylabel("ms to the end of the step's GPU work")
n_waits = int(edges["kind"].isin([EdgeKind.SYNC.value, EdgeKind.STREAM_WAIT.value]).sum())
ax.set_title(f"steps simulated from {len(edges):,} dependencies ({n_waits} waits)")
ax.legend(loc="lower right")
fig.tight_layout()
fig.savefig(FIGURES / "gpu_trace.png", dpi=110)
