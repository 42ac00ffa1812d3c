"""The fidelity benchmark as a library: run a small layout for real, predict it from a slice, compare.

For one case (a GPTConfig whose whole world fits this machine), each repeat:

(a) runs every rank for real (``RealMode.ALL``) and takes per rank its *steady iteration time*
    (median wall time of the clean unprofiled warm-up iterations: neither the first, cold one
    nor the profiler's warm-up step) and its *real peak memory* =
    ``static_bytes(config, stage)`` + the median over profiled iterations of (highest
    ``Total Allocated`` of the rank's ``[memory]`` events inside the iteration's ``prism:iter``
    mark − ``Total Allocated`` just before the iteration started). On CPU the profiler's
    totals only count blocks allocated while it records, so weights, gradients and Adam state
    (made before profiling) are not in them: ``static_bytes`` stands for them, exactly as in
    the prediction;
(b) captures the slice (``RealMode.ROLES``, same warm-up and profiled iterations; by default
    load-matched: the world's other ranks run beside each captured rank, as they share the
    machine in the real run — see ``fidelity_load``), builds the graph of the same layout with
    the given cluster spec and simulates it; the build takes the profiler's cost out of the
    templates with the slice's own unprofiled/profiled ratio (``profiler_overhead``), so the
    prediction is of the unprofiled iteration;
(c) pairs them rank by rank. Records carry medians over repeats; errors are
    (pred − real) / real × 100 of those medians. Each record also keeps the per-repeat values
    and the real median's own standard error (``real_sem_pct``): on a shared machine the real
    runs move between repeats, and an error below that noise is not resolved by the run.

The profiled iterations (1.4-2.6x as long as unprofiled ones on CPU: shapes, memory events and
an Execution Trace are recorded for every op) serve for memory and for the explanations; the
time compared is the one the job takes without a profiler, which is what a user runs.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
from fidelity_cases import case_label
from fidelity_explain import decompose, sim_breakdown, summarize_latencies
from fidelity_load import MatchedLoad

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.graph.build import BuildOptions, build_graph
from prism.graph.calibrate import CalibrationConfig, calibrate
from prism.graph.call_latency import capture_latencies
from prism.graph.memory import iteration_memory
from prism.graph.normalize import normalize_rank
from prism.graph.profiler_overhead import MIN_WARMUP, Correction, clean_unprofiled
from prism.graph.simulate import load_sim_graph, simulate, static_bytes
from prism.replay.paced_capture import run_paced_capture
from prism.replay.runtime import ReplayOptions, run_replay
from prism.schemas.cluster import ClusterSpec, ClusterSpecError, local_path, preset
from prism.schemas.manifest import CaptureFiles, CaptureManifest
from prism.schemas.workload import GPTConfig

Progress = Callable[[str], None]
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """How each side of the comparison is run."""

    warmup: int = 8
    """Unprofiled iterations before the profiled ones; the first (cold) and the last (the
    profiler's warm-up step) aside, they give the real run's steady iteration time."""
    iterations: int = 3
    """Profiled iterations of both the real run and the slice capture."""
    sim_iterations: int = 3
    """Back-to-back iterations simulated; the last gives the steady state."""
    work_dir: Path | None = None
    """Keep captures and graphs here (one folder per case and repeat); None: a temporary folder."""
    matched_load: bool = True
    """Run the world's other ranks beside each slice batch (``fidelity_load.MatchedLoad``), so the
    captured rank shares the machine as it does in the real run; False: it runs alone."""
    replay: bool = True
    """Also replay each role's rank against the graph (``prism-replay``): records of source 'replay'."""
    paced_load: bool = True
    """Beside a paced capture or a replay, the load ranks are replays of the same graph, so they
    wait where the real run's ranks wait (``MatchedLoad(paced_by=...)``); False: free-running."""
    paced: bool = False
    """Also capture each role again paced by the slice's graph (``prism-capture --paced-by``),
    build that graph and simulate it: records of source 'paced'. The replay then runs against
    the paced graph."""
    bracket: bool = True
    """With the replay, run every rank for real right before it and again right after it, and
    take the repeat's real time as the mean of the two: a drift of the machine during the
    replay cancels to first order (the real side moved by up to 20 % between runs an hour
    apart on the 2-vCPU VM). False: one real run per repeat, first."""


@dataclass(frozen=True, kw_only=True)
class RankRun:
    """What one repeat measured or predicted for one rank."""

    iter_ns: float
    """Steady iteration time."""
    peak_bytes: int
    """Peak memory."""
    parts_ms: dict[str, float]
    """compute / comm_wait / glue per iteration, in ms (``fidelity_explain``)."""
    dynamic_bytes: int
    """Peak memory minus static bytes: what the iteration itself allocates at its peak."""
    drift_bytes: int = 0
    """Growth of Total Allocated per iteration (real runs; see ``IterationMemory``)."""
    profiled_ns: float = 0.0
    """Median wall time of the profiled iterations (real runs)."""
    bracket_ns: tuple[float, float] | None = None
    """Steady iteration time of the real runs before and after the replay (``RunSettings.bracket``),
    whose mean is ``iter_ns``; None: one real run."""


@dataclass(kw_only=True)
class CaseResult:
    """Everything one case produced."""

    records: list[dict]
    """One per rank: the benchmark's table."""
    breakdown: list[dict] = field(default_factory=list)
    """One per rank: where the iteration goes, real vs slice vs simulation (ms, medians)."""
    collectives: list[dict] = field(default_factory=list)
    """Real gloo collectives of the real runs: latency and skew vs the comm model."""


# -- the comm calibration ------------------------------------------------------------------------

CALIBRATION_OPS = ("all_reduce", "send")
"""The GPT workload's process-group calls: all_reduce (TP, DP, loss) and send/recv (PP)."""
KiB, MiB = 2**10, 2**20
CALIBRATION_SIZES = (512, 4 * KiB, 64 * KiB, 128 * KiB, 1 * MiB, 8 * MiB, 16 * MiB, 32 * MiB)
"""Bytes a fresh calibration times: the default cases' own calls (512 B loss and 64/128 KiB
activation all-reduces, 64/128 KiB pipeline sends, 7-21 MB gradient buckets) and points around
them, so that the fit (or, with ``--calibrate-table``, the measured table) covers them."""


@dataclass(frozen=True, kw_only=True)
class SpecChoice:
    """The cluster spec the predictions use, and where it came from."""

    spec: ClusterSpec
    """The spec."""
    source: str
    """A line saying which file it is and how it got there."""


def resolve_spec(
    path: Path | None, calibrate_into: Path, *, recalibrate: bool = False, compute_between_ms: float = 0.0,
    reps: int = CalibrationConfig.reps, cold_gaps_ms: tuple[float, ...] = (),
    sizes: tuple[int, ...] = CALIBRATION_SIZES, measured_table: bool = False,
) -> SpecChoice:  # fmt: skip
    """``path`` if given; else the calibrated 'local' preset; else (or if ``recalibrate``) calibrate now.

    A fresh calibration times gloo all_reduce and send/recv of ``sizes`` between 2 processes
    (fitted, and written into the spec's measured table too if ``measured_table``; cold calls
    after ``compute_between_ms`` of compute when > 0; a ``cold_call`` table for
    ``cold_gaps_ms``) and is written to ``calibrate_into``, never to the shared 'local' path.
    """
    if path is not None:
        return SpecChoice(spec=ClusterSpec.load(path), source=f"{path} (given)")
    if not recalibrate:
        try:
            return SpecChoice(spec=preset("local"), source=f"{local_path()} (the calibrated 'local' preset)")
        except ClusterSpecError:
            pass
    result = calibrate(
        CalibrationConfig(
            max_procs=2,
            ops=CALIBRATION_OPS,
            out=calibrate_into,
            compute_between_ms=compute_between_ms,
            reps=reps,
            cold_gaps_ms=cold_gaps_ms,
            sizes=sizes,
            measured_table=measured_table,
        )
    )
    why = "--recalibrate" if recalibrate else f"no 'local' spec at {local_path()}"
    return SpecChoice(
        spec=result.spec,
        source=f"{result.path} (calibrated now: {why}; {result.spec.notes}; "
        f"median relative error {result.median_rel_error:.0%})",
    )


# -- (a) the real run ---------------------------------------------------------------------------


def _steady_ns(manifest: CaptureManifest, rank: int) -> float:
    """Median wall time of the rank's clean unprofiled iterations: the job as it runs unobserved."""
    result = next(r.result for r in manifest.ranks if r.rank == rank)
    clean = clean_unprofiled(result.iteration_ns, manifest.job.warmup)
    if not clean:
        raise ValueError(
            f"warm-up {manifest.job.warmup} leaves no clean unprofiled iteration (needs >= {MIN_WARMUP})"
        )
    return float(statistics.median(clean))


def _profiled_ns(manifest: CaptureManifest, rank: int) -> float:
    result = next(r.result for r in manifest.ranks if r.rank == rank)
    return float(statistics.median(result.iteration_ns[manifest.job.warmup :]))


def measure_real(config: GPTConfig, settings: RunSettings, out: Path) -> dict[int, RankRun]:
    """Run every rank for real; steady iteration time, real peak memory and time split per rank."""
    options = CaptureOptions(
        config=config, real=RealMode.ALL, warmup=settings.warmup, iterations=settings.iterations, out_dir=out
    )
    manifest = run_capture(options)
    runs = {}
    for rank in range(config.layout.world_size):
        mem = iteration_memory(CaptureFiles(out).kineto(rank))
        runs[rank] = RankRun(
            iter_ns=_steady_ns(manifest, rank),
            peak_bytes=static_bytes(config, config.layout.stage(rank)) + mem.peak_delta_bytes,
            parts_ms=decompose(normalize_rank(out, rank)),
            profiled_ns=_profiled_ns(manifest, rank),
            dynamic_bytes=mem.peak_delta_bytes,
            drift_bytes=mem.drift_bytes,
        )
    return runs


def bracketed(before: dict[int, RankRun], after: dict[int, RankRun]) -> dict[int, RankRun]:
    """The real runs before and after the replay as one: mean steady time, the rest from ``before``."""
    return {
        rank: replace(
            run,
            iter_ns=(run.iter_ns + after[rank].iter_ns) / 2,
            bracket_ns=(run.iter_ns, after[rank].iter_ns),
        )
        for rank, run in before.items()
    }


# -- (b) the prediction -------------------------------------------------------------------------


def build_case_graph(
    config: GPTConfig,
    capture: Path,
    graph: Path,
    spec: ClusterSpec,
    correction: Correction = Correction.PHASE,
) -> None:
    """The graph of the case's own layout, built as prism-build-graph does."""
    options = BuildOptions(
        capture_dir=capture, out=graph, tp=config.tp, pp=config.pp, dp=config.dp, cluster=spec,
        profiler_correction=correction,
    )  # fmt: skip
    build_graph(options)


def predict(
    config: GPTConfig, spec: ClusterSpec, settings: RunSettings, out: Path
) -> tuple[dict[int, RankRun], dict[int, dict[str, float]]]:
    """Capture the slice, build and simulate the graph: per rank prediction, per role rank slice split."""
    capture = out / "slice"
    options = CaptureOptions(
        config=config,
        real=RealMode.ROLES,
        warmup=settings.warmup,
        iterations=settings.iterations,
        out_dir=capture,
    )
    manifest = _beside_load(config, settings, partial(run_capture, options))
    build_case_graph(config, capture, out / "graph.parquet", spec)
    predicted = _simulated(config, out / "graph.parquet", settings)
    slice_parts = {
        r.rank: {
            **decompose(normalize_rank(capture, r.rank)),
            "dynamic_bytes": iteration_memory(CaptureFiles(capture).kineto(r.rank)).peak_delta_bytes,
            "unprofiled_ms": _steady_ns(manifest, r.rank) / 1e6,
            "profiled_ms": _profiled_ns(manifest, r.rank) / 1e6,
        }
        for r in manifest.ranks
    }
    return predicted, slice_parts


def _simulated(config: GPTConfig, graph_path: Path, settings: RunSettings) -> dict[int, RankRun]:
    """Every rank's simulated steady iteration, peak memory and time split."""
    graph = load_sim_graph(graph_path)
    result = simulate(graph, iterations=settings.sim_iterations)
    parts = sim_breakdown(graph, result)
    return {
        rank: RankRun(
            iter_ns=float(result.iteration_ns[rank]),
            peak_bytes=int(result.peak_bytes[rank]),
            parts_ms=parts[rank],
            dynamic_bytes=int(result.peak_bytes[rank]) - static_bytes(config, config.layout.stage(rank)),
        )
        for rank in range(graph.ranks)
    }


PACED_GRAPH = "paced.parquet"


def predict_paced(
    config: GPTConfig, spec: ClusterSpec, settings: RunSettings, out: Path
) -> dict[int, RankRun]:
    """Capture each role again paced by the graph ``predict`` built in ``out`` (load-matched, the
    load ranks paced by the same graph), build ``out / PACED_GRAPH`` from it and simulate it."""
    capture, pacing = out / "paced", out / "graph.parquet"
    pace = partial(run_paced_capture, pacing, capture, warmup=settings.warmup, iterations=settings.iterations)
    _beside_load(config, settings, pace, timed_by=pacing)
    build_case_graph(config, capture, out / PACED_GRAPH, spec)
    return _simulated(config, out / PACED_GRAPH, settings)


def _beside_load(
    config: GPTConfig, settings: RunSettings, run: Callable[..., T], timed_by: Path | None = None
) -> T:
    """``run(hooks=...)``, beside the world's other ranks (``MatchedLoad``) if ``settings.matched_load``:
    free-running ones, or replays of ``timed_by`` (the graph that times the run) if
    ``settings.paced_load``."""
    if not settings.matched_load:
        return run(hooks=None)
    paced_by = timed_by if settings.paced_load else None
    with MatchedLoad(
        config, warmup=settings.warmup, iterations=settings.iterations, paced_by=paced_by
    ) as load:
        return run(hooks=load)


def replay_roles(
    config: GPTConfig, settings: RunSettings, out: Path, graph: str = "graph.parquet"
) -> dict[int, RankRun]:
    """Replay each role's rank against ``out / graph`` (the slice's, or the paced one); with
    ``settings.paced_load`` the load ranks beside it are replays of the same graph."""
    ranks = tuple(sorted(config.layout.roles().values()))
    # One at a time, each the only real rank, beside load ranks that stand in for the rest of
    # the real run's processes (as the slice was captured).
    options = ReplayOptions(
        graph=out / graph, ranks=ranks, out_dir=out / "replay",
        warmup=settings.warmup, iterations=settings.iterations, separately=True,
    )  # fmt: skip
    report = _beside_load(config, settings, partial(run_replay, options), timed_by=out / graph)
    return {
        r.rank: RankRun(
            iter_ns=r.measured_iter_ms * 1e6,
            peak_bytes=int(r.measured_peak_bytes),
            parts_ms={},
            dynamic_bytes=int(r.measured_peak_bytes) - static_bytes(config, r.stage),
        )
        for r in report.ranks
    }


# -- (c) pairing ----------------------------------------------------------------------------------


def _err_pct(pred: float, real: float) -> float:
    return (pred - real) / real * 100.0 if real else float("nan")


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _median_se(values: list[float]) -> float | None:
    """Standard error of the median of ``values`` (normal approximation, 1.2533·sd/√n); None from one value."""
    if len(values) < 2:
        return None
    return float(1.2533 * np.std(values, ddof=1) / np.sqrt(len(values)))


def _median_sem_pct(values: list[float]) -> float | None:
    """``_median_se`` as a percentage of the median: how far the real side alone moves between repeats."""
    se = _median_se(values)
    return None if se is None else se / float(np.median(values)) * 100.0


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _records(
    label: str, real: list[dict[int, RankRun]], pred: list[dict[int, RankRun]], source: str = "simulation"
) -> list[dict]:
    records = []
    for rank in sorted(pred[0]) if pred else []:
        real_repeats = [run[rank].iter_ns / 1e6 for run in real]
        pred_repeats = [run[rank].iter_ns / 1e6 for run in pred]
        real_ms, pred_ms = _median(real_repeats), _median(pred_repeats)
        sem = _median_sem_pct(real_repeats)
        real_peak = int(_median([run[rank].peak_bytes for run in real]))
        pred_peak = int(_median([run[rank].peak_bytes for run in pred]))
        # The same errors repeat by repeat: each prediction against the real run(s) beside it in time.
        brackets = [run[rank].bracket_ns for run in real if run[rank].bracket_ns is not None]
        drifts = [abs(_err_pct(after, before)) for before, after in brackets]
        paired = [_err_pct(p, r) for p, r in zip(pred_repeats, real_repeats, strict=True)]
        records.append(
            {
                "case": label, "rank": rank, "source": source,
                "real_iter_ms": round(real_ms, 3), "pred_iter_ms": round(pred_ms, 3),
                "iter_err_pct": round(_err_pct(pred_ms, real_ms), 2),
                "real_peak_bytes": real_peak, "pred_peak_bytes": pred_peak,
                "mem_err_pct": round(_err_pct(pred_peak, real_peak), 3),
                "real_repeats_ms": [round(v, 3) for v in real_repeats],
                "pred_repeats_ms": [round(v, 3) for v in pred_repeats],
                "real_sem_pct": _round(sem),
                "paired_err_pct": round(_median(paired), 2),
                "paired_se_pct": _round(_median_se(paired)),
                "real_bracket_drift_pct": _round(_median(drifts)) if drifts else None,
            }
        )  # fmt: skip
    return records


def _breakdown(
    label: str,
    config: GPTConfig,
    real: list[dict[int, RankRun]],
    pred: list[dict[int, RankRun]],
    slices: list[dict],
) -> list[dict]:
    layout = config.layout
    roles = layout.roles()
    rows = []
    for rank in sorted(real[0]):
        role_rank = roles[layout.role(rank)]
        row: dict = {"case": label, "rank": rank}
        for part in ("compute", "comm_wait", "glue"):
            row[f"real_{part}_ms"] = round(_median([run[rank].parts_ms[part] for run in real]), 3)
            row[f"slice_{part}_ms"] = round(_median([s[role_rank][part] for s in slices]), 3)
            row[f"pred_{part}_ms"] = round(_median([run[rank].parts_ms[part] for run in pred]), 3)
        # Memory allocated by the iteration itself at its peak (static bytes left out), and how
        # much the real run's allocator total grows per iteration (it should not).
        row["real_dynamic_bytes"] = int(_median([run[rank].dynamic_bytes for run in real]))
        row["slice_dynamic_bytes"] = int(_median([s[role_rank]["dynamic_bytes"] for s in slices]))
        row["pred_dynamic_bytes"] = int(_median([run[rank].dynamic_bytes for run in pred]))
        row["real_drift_bytes_per_iter"] = int(_median([run[rank].drift_bytes for run in real]))
        # Whole iterations with and without the profiler: the slice's ratio is the build's correction.
        row["real_unprofiled_ms"] = round(_median([run[rank].iter_ns / 1e6 for run in real]), 3)
        row["real_profiled_ms"] = round(_median([run[rank].profiled_ns / 1e6 for run in real]), 3)
        row["slice_unprofiled_ms"] = round(_median([s[role_rank]["unprofiled_ms"] for s in slices]), 3)
        row["slice_profiled_ms"] = round(_median([s[role_rank]["profiled_ms"] for s in slices]), 3)
        rows.append(row)
    return rows


def case_dir(work_dir: Path, label: str) -> Path:
    """Where a case's repeats are kept under ``--work-dir`` (``repeat0``, ``repeat1``, ...)."""
    return work_dir / label.replace(" ", "_").replace("=", "")


def _repeat_dir(settings: RunSettings, label: str, repeat: int) -> tempfile.TemporaryDirectory | Path:
    if settings.work_dir is None:
        return tempfile.TemporaryDirectory(prefix="prism-fidelity-")
    path = case_dir(settings.work_dir, label) / f"repeat{repeat}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def run_case_detailed(
    config: GPTConfig,
    repeats: int,
    spec: ClusterSpec,
    settings: RunSettings | None = None,
    progress: Progress | None = None,
) -> CaseResult:
    """Measure and predict ``config`` ``repeats`` times (real run and slice interleaved) and pair them."""
    settings = settings or RunSettings()
    say = progress or (lambda _: None)
    label = case_label(config)
    real, pred, paced, replayed, slices, latencies = [], [], [], [], [], []
    for repeat in range(repeats):
        holder = _repeat_dir(settings, label, repeat)
        root = Path(holder.name) if isinstance(holder, tempfile.TemporaryDirectory) else holder
        step = f"[{label}] repeat {repeat + 1}/{repeats}:"
        bracket = settings.replay and settings.bracket
        try:
            if not bracket:
                say(f"{step} every rank real")
                real.append(measure_real(config, settings, root / "real"))
            say(f"{step} slice capture, build, simulate")
            predicted, slice_parts = predict(config, spec, settings, root)
            pred.append(predicted)
            slices.append(slice_parts)
            graph = "graph.parquet"
            if settings.paced:
                say(f"{step} paced capture, build, simulate")
                paced.append(predict_paced(config, spec, settings, root))
                graph = PACED_GRAPH
            if bracket:
                say(f"{step} every rank real (before the replay)")
                before = measure_real(config, settings, root / "real")
            if settings.replay:
                say(f"{step} replay of each role's rank against {graph}")
                replayed.append(replay_roles(config, settings, root, graph))
            if bracket:
                say(f"{step} every rank real (after the replay)")
                real.append(bracketed(before, measure_real(config, settings, root / "real_after")))
            latencies += capture_latencies(root / "real")
        finally:
            if isinstance(holder, tempfile.TemporaryDirectory):
                holder.cleanup()
    return CaseResult(
        records=_records(label, real, pred)
        + _records(label, real, paced, "paced")
        + _records(label, real, replayed, "replay"),
        breakdown=_breakdown(label, config, real, pred, slices),
        collectives=[{"case": label, **row} for row in summarize_latencies(latencies, spec)],
    )


def run_case(
    case_config: GPTConfig, repeats: int, spec: ClusterSpec, settings: RunSettings | None = None
) -> list[dict]:
    """One record per rank of ``case_config``: real vs predicted iteration time and peak memory."""
    return run_case_detailed(case_config, repeats, spec, settings).records


def mean_abs(records: list[dict], key: str) -> float:
    """Mean of |record[key]| over ``records``."""
    return float(np.mean([abs(r[key]) for r in records])) if records else float("nan")
