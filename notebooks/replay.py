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
# # A replay: the real rank against its prediction, beside a virtual neighbour
#
# A slice of the built-in GPT (tp=1, pp=2, dp=2) is captured and its graph built; then the last
# pipeline stage's rank runs for real against the graph (`prism-replay`), the first stage's rank
# of its pipeline being a virtual participant whose trace the replay writes too
# (`--trace-peers`). Left: the real rank's wall iteration and its time by phase, measured against
# the graph's prediction. Right: one profiled iteration of both ranks on the real rank's trace
# clock: the real rank's blocks from its Kineto trace, the virtual rank's nodes as the
# co-simulation ran them.

# %%
import gzip
import json
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prism.capture.runner import CaptureOptions, run_capture
from prism.graph.build.builder import BuildOptions, build_graph
from prism.replay.runtime import ReplayOptions, run_replay
from prism.schemas.annotations import BLOCK_PHASES, try_parse_mark
from prism.schemas.cluster import preset
from prism.schemas.replay import ReplayFiles
from prism.capture.workloads.gpt.config import GPTConfig

FIGURES = Path(os.environ.get("PRISM_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
# Captures, graphs and replays go to a folder removed when the kernel exits.
workspace = tempfile.TemporaryDirectory(prefix="prism-notebook-")
work = Path(workspace.name)
config = GPTConfig(layers=4, hidden=64, heads=4, seq_len=32, vocab=256, microbatches=4, tp=1, pp=2, dp=2)
run_capture(CaptureOptions(config=config, out_dir=work / "capture", warmup=3, iterations=1))
graph = work / "graph.parquet"
build_graph(
    BuildOptions(capture_dir=work / "capture", out=graph, tp=1, pp=2, dp=2, cluster=preset("h100-ib"))
)
real = config.layout.rank(tp=0, dp=0, pp=1)
virtual = config.layout.rank(tp=0, dp=0, pp=0)
report = run_replay(
    ReplayOptions(
        graph=graph, ranks=(real,), out_dir=work / "replay", warmup=5, iterations=1, trace_peers=(virtual,)
    )
)
rank = report.ranks[0]
print(f"rank {real}: wall {rank.wall_iter_ms:.2f} ms against {rank.predicted_iter_ms:.2f} ms predicted "
      f"({rank.wall_err_pct:+.1f} %)")  # fmt: skip

# %% [markdown]
# The real rank's blocks come from the `prism:` marks of its profiled iteration (top-level ones:
# a forward or backward of a microbatch, a transfer, the gradient sync, the optimizer step); the
# virtual rank's from its trace's events, one per graph node, by the node's phase.

# %%
COLORS = {"fwd": "#4C72B0", "bwd": "#DD8452", "optim": "#55A868", "grad_sync": "#8172B3",
          "send": "#C44E52", "recv": "#C44E52", "p2p_wait": "#E8B4B8"}  # fmt: skip
files = ReplayFiles(work / "replay")
events = json.loads(gzip.decompress(files.kineto(real).read_bytes()))["traceEvents"]
blocks = []
for e in events:
    mark = try_parse_mark(e.get("name", "")) if e.get("ph") == "X" else None
    if mark is not None and mark.phase in BLOCK_PHASES and mark.layer is None and mark.part is None:
        blocks.append((str(mark.phase.value), e["ts"], e["dur"]))
peer = json.loads(files.peer_trace(virtual).read_text())["traceEvents"]
last = max(e["args"]["iteration"] for e in peer if e["ph"] == "X")
nodes = [(e["cat"], e["ts"], e["dur"]) for e in peer if e["ph"] == "X" and e["args"]["iteration"] == last]
start = min(ts for _, ts, _ in blocks)
end = max(ts + dur for _, ts, dur in blocks)
nodes = [(c, ts, d) for c, ts, d in nodes if ts + d >= start and ts <= end]

fig, (phases, timeline) = plt.subplots(1, 2, figsize=(13, 4), width_ratios=[1, 2.2])
names = [p.phase for p in rank.phases]
x = range(len(names))
phases.bar([i - 0.2 for i in x], [p.measured_ms for p in rank.phases], 0.4, label="replayed (wall)")
phases.bar([i + 0.2 for i in x], [p.predicted_ms for p in rank.phases], 0.4, label="graph")
phases.set_xticks(list(x), names, rotation=30, ha="right")
phases.set(ylabel="ms per iteration", title=f"rank {real}: {rank.wall_iter_ms:.1f} ms wall, "
           f"{rank.predicted_iter_ms:.1f} ms predicted")  # fmt: skip
phases.legend(fontsize=8)
for y, spans in enumerate([blocks, nodes]):
    for name, color in COLORS.items():
        pick = [((ts - start) / 1e3, dur / 1e3) for p, ts, dur in spans if p == name]
        timeline.broken_barh(pick, (y - 0.35, 0.7), color=color, label=name if y == 0 else None)
timeline.set_yticks([0, 1], [f"rank {real} (real, stage 1)", f"rank {virtual} (virtual, stage 0)"])
timeline.invert_yaxis()
timeline.set(xlabel="ms in the iteration",
             title="one profiled iteration (the profiler slows the real rank), on the real rank's clock")  # fmt: skip
timeline.legend(fontsize=8, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
fig.tight_layout()
fig.savefig(FIGURES / "replay.png", dpi=110)
