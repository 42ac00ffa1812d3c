"""Help texts of the command-line options that several prism commands share, written once."""

GRAPH_IN = "graph.parquet built by prism-build-graph."
TP = "Target tensor-parallel degree."
PP = "Target pipeline-parallel degree."
DP = "Target data-parallel degree."
OVERWRITE = "Replace a non-empty output directory."
WARMUP = (
    "Unprofiled iterations before the profiled ones; from 3 on, the clean ones (not the first or "
    "last) give the steady time and let the build take the profiler's cost out of its predictions; "
    "8 of them (the default) give a steady estimate of how much iterations vary."
)
ITERATIONS = "Profiled iterations after the warm-up (traces and peak memory)."
THREADS = "torch intra-op threads per real rank process."
RANK_TIMEOUT = "Seconds before stuck rank processes are killed."
CLUSTER = "Cluster spec: a preset name (e.g. h100-ib, local) or a TOML file."
