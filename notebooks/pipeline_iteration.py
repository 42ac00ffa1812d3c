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
# # A pipeline iteration, simulated
#
# A slice of the built-in GPT (tp=1, pp=4, dp=2, 8 microbatches, 1F1B) is captured on this
# machine, its full graph built and simulated. The figure shows one steady iteration of every
# pipeline stage (the ranks of dp replica 0): what each stage computes, sends and waits for
# when (a transfer's bar runs from the call to its end, so it holds the wait for the other
# stage: the pipeline bubble), the critical path through them, each stage's memory over the
# iteration, and where each stage's iteration goes (compute, overhead, exposed communication,
# bubble).

# %%
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from prism.capture.runner import CaptureOptions, run_capture
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.sim.engine import COLLECTIVE, COMPUTE
from prism.graph.sim.metrics import breakdown, critical_path
from prism.graph.sim.simulate import simulate
from prism.graph.sim.load import graph_column, load_sim_graph
from prism.schemas.cluster import preset
from prism.capture.workloads.gpt.config import GPTConfig

FIGURES = Path(os.environ.get("PRISM_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
# Captures, graphs and replays go to a folder removed when the kernel exits.
workspace = tempfile.TemporaryDirectory(prefix="prism-notebook-")
work = Path(workspace.name)
config = GPTConfig(layers=8, hidden=64, heads=4, seq_len=32, vocab=256, microbatches=8, tp=1, pp=4, dp=2)
run_capture(CaptureOptions(config=config, out_dir=work / "capture", warmup=3, iterations=1))
graph_path = work / "graph.parquet"
build_graph(
    BuildOptions(capture_dir=work / "capture", out=graph_path, tp=1, pp=4, dp=2, cluster=preset("h100-ib"))
)

# %% [markdown]
# Simulate two passes (the second is the steady one) and find the critical path: from the node
# that ends last, back through whatever made each node start when it did.

# %%
graph = load_sim_graph(graph_path)
result = simulate(graph, iterations=2)
path = critical_path(graph, result)
phase = graph_column(graph_path, "phase")
layout = graph.layout
stages = [layout.rank(tp=0, dp=0, pp=s) for s in range(layout.pp)]
t0 = min(int(result.rank_start_ns[r]) for r in stages)
print(f"iteration {result.iteration_ns.max() / 1e6:.2f} ms; critical path {len(path)} nodes")


# %%
def category(row: int) -> str:
    if graph.kind[row] == COLLECTIVE:
        return "gradient all-reduce"
    if graph.kind[row] != COMPUTE:
        return "transfer, with its wait"
    p = str(phase[row])
    return {"fwd": "forward", "bwd": "backward", "optim": "optimizer"}.get(p, "other compute")


COLORS = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868", "other compute": "#8C8C8C",
          "transfer, with its wait": "#C44E52", "gradient all-reduce": "#8172B3"}  # fmt: skip
on_path = np.zeros(len(graph.kind), bool)
on_path[path] = True

fig = plt.figure(figsize=(13, 6.5))
grid = fig.add_gridspec(2, 2, width_ratios=[4, 1], height_ratios=[3, 2])
timeline = fig.add_subplot(grid[0, 0])
memory = fig.add_subplot(grid[1, 0], sharex=timeline)
parts = fig.add_subplot(grid[:, 1])
for y, rank in enumerate(stages):
    rows = np.arange(graph.rank_ptr[rank], graph.rank_ptr[rank + 1])
    start_ms = (result.start_ns[rows] - t0) / 1e6
    span_ms = (result.end_ns[rows] - result.start_ns[rows]) / 1e6
    cats = np.array([category(r) for r in rows])
    for name, color in COLORS.items():
        pick = cats == name
        timeline.broken_barh(list(zip(start_ms[pick], span_ms[pick], strict=True)), (y - 0.35, 0.7), color=color,
                             label=name if y == 0 else None)  # fmt: skip
    crit = on_path[rows]
    timeline.broken_barh(list(zip(start_ms[crit], span_ms[crit], strict=True)), (y + 0.38, 0.08), color="black",
                         label="critical path" if y == 0 else None)  # fmt: skip
    order = np.argsort(result.start_ns[rows], kind="stable")
    held = np.cumsum((graph.alloc[rows] - graph.free[rows])[order])
    static = graph.static_bytes[rank]
    memory.step(start_ms[order], (static + held) / 2**20, where="post", label=f"stage {y}")
timeline.set_yticks(range(len(stages)), [f"stage {s}" for s in range(len(stages))])
timeline.invert_yaxis()
timeline.tick_params(labelbottom=False)
timeline.set_title(f"one steady iteration, tp=1 pp=4 dp=2, 8 microbatches (1F1B): "
                   f"{result.iteration_ns.max() / 1e6:.1f} ms simulated")  # fmt: skip
timeline.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=7, fontsize=8, frameon=False)
memory.set_ylabel("memory (MiB)")
memory.set_xlabel("time in the iteration (ms)")
memory.legend(fontsize=8, ncol=4)

# Where each stage's iteration goes: its compute, the overhead between ops, the communication it
# waits for beyond its own work (exposed), and the pipeline bubble (waiting for other stages).
split = breakdown(graph, result)
left = np.zeros(len(stages))
for name, values, color in [
    ("compute", split.compute_ns, "#4C72B0"), ("overhead", split.overhead_ns, "#8C8C8C"),
    ("exposed comm", split.exposed_comm_ns, "#8172B3"), ("bubble", split.bubble_ns, "#C44E52"),
]:  # fmt: skip
    ms = values[stages] / 1e6
    parts.barh(range(len(stages)), ms, left=left, color=color, label=name)
    left += ms
parts.set_yticks(range(len(stages)), [f"stage {s}" for s in range(len(stages))])
parts.invert_yaxis()
parts.set(xlabel="ms of the iteration", title="where it goes")
parts.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
fig.tight_layout()
fig.savefig(FIGURES / "pipeline_iteration.png", dpi=110)
