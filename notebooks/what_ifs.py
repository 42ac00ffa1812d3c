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
# # What-ifs: the predicted iteration against a sweep
#
# One slice capture of the built-in GPT (tp=1, pp=4; 4 microbatches per dp rank) answers several
# questions without running the job again: how much one slow rank costs, how the pipeline bubble
# shrinks with more microbatches, what more data-parallel replicas add, and what a slower network
# would do. Microbatches and dp degree are new builds from the same capture; a slow rank and a
# network are what-ifs applied to one graph (as `prism-simulate --slow-rank/--cluster` does).

# %%
import dataclasses
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

from prism.capture.runner import CaptureOptions, run_capture
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.sim.metrics import breakdown
from prism.graph.sim.simulate import simulate
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.whatif import SlowRank, WhatIf, apply_what_if
from prism.schemas.cluster import preset
from prism.capture.workloads.gpt.config import GPTConfig

FIGURES = Path(os.environ.get("PRISM_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
# Captures, graphs and replays go to a folder removed when the kernel exits.
workspace = tempfile.TemporaryDirectory(prefix="prism-notebook-")
work = Path(workspace.name)
H100 = preset("h100-ib")
config = GPTConfig(layers=8, hidden=64, heads=4, seq_len=32, vocab=256, microbatches=4, tp=1, pp=4, dp=2)
run_capture(CaptureOptions(config=config, out_dir=work / "capture", warmup=3, iterations=1))


def build(dp: int = 2, microbatches: int | None = None) -> Path:
    out = work / f"graph-dp{dp}-mb{microbatches}.parquet"
    build_graph(BuildOptions(capture_dir=work / "capture", out=out, tp=1, pp=4, dp=dp, cluster=H100,
                             microbatches=microbatches))  # fmt: skip
    return out


def job_ms(graph, path=None, what_if: WhatIf | None = None) -> tuple[float, float]:
    """The job's iteration (its slowest rank) and the mean pipeline bubble share, ms and %."""
    if what_if is not None:
        graph = apply_what_if(graph, path, what_if)
    result = simulate(graph, iterations=2)
    parts = breakdown(graph, result)
    return result.iteration_ns.max() / 1e6, 100 * (parts.bubble_ns / result.iteration_ns).mean()


# %% [markdown]
# The sweeps.

# %%
base_path = build()
base = load_sim_graph(base_path)
slow_rank = config.layout.rank(tp=0, dp=0, pp=1)
slowdowns = [1.0, 1.1, 1.25, 1.5, 2.0]
slow = [
    job_ms(base, base_path, WhatIf(slow_ranks=(SlowRank(rank=slow_rank, factor=f),)))[0] for f in slowdowns
]
microbatches = [4, 8, 16, 32]
by_mb = [job_ms(load_sim_graph(build(microbatches=m))) for m in microbatches]
dps = [2, 8, 32, 128]
by_dp = [job_ms(load_sim_graph(build(dp=d)))[0] for d in dps]
networks = {
    "h100-ib": H100,
    "1/4 inter-node bandwidth": dataclasses.replace(
        H100, inter_bandwidth_bytes_per_s=H100.inter_bandwidth_bytes_per_s / 4
    ),
    "10x latency": dataclasses.replace(
        H100, inter_latency_s=10 * H100.inter_latency_s, intra_latency_s=10 * H100.intra_latency_s
    ),  # fmt: skip
}
dp32_path = build(dp=32)
dp32 = load_sim_graph(dp32_path)
by_network = {name: job_ms(dp32, dp32_path, WhatIf(cluster=spec))[0] for name, spec in networks.items()}
print("slow rank:", dict(zip(slowdowns, slow, strict=True)))
print("microbatches:", dict(zip(microbatches, by_mb, strict=True)))
print("dp:", dict(zip(dps, by_dp, strict=True)))
print("network (dp=32):", by_network)

# %%
fig, axes = plt.subplots(2, 2, figsize=(11, 7))
ax = axes[0, 0]
ax.plot([100 * (f - 1) for f in slowdowns], slow, "o-")
ax.set(
    title=f"one slow rank (rank {slow_rank}, stage 1)",
    xlabel="its compute slower by (%)",
    ylabel="iteration (ms)",
)
ax = axes[0, 1]
ax.plot(microbatches, [ms / m for (ms, _), m in zip(by_mb, microbatches, strict=True)], "o-")
ax.set(title="microbatches per iteration", xlabel="microbatches", ylabel="iteration per microbatch (ms)")
ax.set_xscale("log", base=2)
ax.set_xticks(microbatches, [str(m) for m in microbatches], minor=False)
ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
bubble = ax.twinx()
bubble.plot(microbatches, [b[1] for b in by_mb], "s--", color="C3")
bubble.set_ylabel("pipeline bubble (% of the iteration)", color="C3")
ax = axes[1, 0]
ax.plot([4 * d for d in dps], by_dp, "o-")
ax.set(title="data-parallel replicas (pp=4 each)", xlabel="ranks in the job", ylabel="iteration (ms)")
ax.set_xscale("log", base=2)
ax.set_xticks([4 * d for d in dps], [str(4 * d) for d in dps])
ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
ax = axes[1, 1]
bars = ax.barh(list(by_network), list(by_network.values()), color=["C0", "C1", "C2"])
ax.bar_label(bars, fmt="%.2f ms", padding=-70, color="white")
ax.set(title="the network, at dp=32 (128 ranks)", xlabel="iteration (ms)")
fig.tight_layout()
fig.savefig(FIGURES / "what_ifs.png", dpi=110)
