"""prism.fidelity: the fidelity benchmark as a library: run a small layout for real, predict it from a slice, compare.

For one case (a GPTConfig whose whole world fits this machine), each repeat:

(a) runs every rank for real (``RealMode.ALL``) and takes per rank its *steady iteration time*
    (median wall time of the clean unprofiled warm-up iterations: neither the first, cold one
    nor the profiler's warm-up step) and its *real peak memory* =
    ``static_bytes(config, stage)`` + the median over profiled iterations of (highest
    ``Total Allocated`` of the rank's ``[memory]`` events inside the iteration's ``prism:iter``
    mark − ``Total Allocated`` just before the iteration started). On CPU the profiler's
    totals only count blocks allocated while it records, so weights, gradients and Adam state
    (made before profiling) are not in them: ``static_bytes`` (the GPT's own count,
    ``prism.capture.workloads.gpt.params``) stands for them, where the prediction has what the
    capture read from the model and optimizer;
(b) captures the slice (``RealMode.ROLES``, same warm-up and profiled iterations; by default
    load-matched: the world's other ranks run beside each captured rank, as they share the
    machine in the real run — see ``prism.fidelity.load``), builds the graph of the same layout with
    the given cluster spec and simulates it; the build takes the profiler's cost out of the
    templates with the slice's own unprofiled/profiled ratio (``profiler_overhead``), so the
    prediction is of the unprofiled iteration;
(c) pairs them rank by rank. Records carry medians over repeats; errors are
    (pred − real) / real × 100 of those medians. Each record also keeps the per-repeat values
    and the real median's own standard error (``real_sem_pct``): on a shared machine the real
    runs move between repeats, and an error below that noise is not resolved by the run.

The profiled iterations (several times as long as unprofiled ones on CPU: shapes, memory events and
an Execution Trace are recorded for every op) serve for memory and for the explanations; the
time compared is the one the job takes without a profiler, which is what a user runs.
"""

from prism.fidelity.case import CaseResult, case_dir, run_case, run_case_detailed
from prism.fidelity.cases import (
    DEFAULT_CASES,
    CaseError,
    captured_config,
    case_label,
    parse_case,
    random_cases,
)
from prism.fidelity.compare import mean_abs, mean_errors
from prism.fidelity.measure import PACED_GRAPH, Pacing, RankRun, RunSettings, build_case_graph
from prism.fidelity.spec import CALIBRATION_SIZES, SpecChoice, resolve_spec

__all__ = [
    "CALIBRATION_SIZES",
    "DEFAULT_CASES",
    "PACED_GRAPH",
    "Pacing",
    "CaseError",
    "CaseResult",
    "RankRun",
    "RunSettings",
    "SpecChoice",
    "build_case_graph",
    "case_dir",
    "captured_config",
    "case_label",
    "mean_abs",
    "mean_errors",
    "parse_case",
    "random_cases",
    "resolve_spec",
    "run_case",
    "run_case_detailed",
]
