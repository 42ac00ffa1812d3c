"""Each side of one repeat: every rank for real, the slice's prediction, the paced prediction,
the replay of each role's rank; what each measured or predicted per rank (``RankRun``)."""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TypeVar

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.capture.workloads.gpt.config import GPTConfig
from prism.capture.workloads.gpt.params import static_bytes
from prism.fidelity.explain import (
    decompose,
    graph_own_ns,
    measured_blocks_ms,
    measured_phases_ms,
    own_phases_ms,
    sim_breakdown,
)
from prism.fidelity.load import MatchedLoad
from prism.fidelity.steal import STEAL_LIMIT_PCT, STEAL_TRIES, run_unstolen
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.build.normalize import normalize_rank
from prism.graph.build.profiler_overhead import Correction
from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.metrics import breakdown
from prism.graph.sim.simulate import simulate
from prism.graph.traces.memory import iteration_memory
from prism.replay.paced_capture import run_paced_capture
from prism.replay.runtime import ReplayOptions, run_replay
from prism.schemas.cluster import ClusterSpec
from prism.schemas.iterations import MIN_WARMUP, clean_unprofiled
from prism.schemas.manifest import CaptureFiles, CaptureManifest, RankResult
from prism.schemas.program import ProgramSpec
from prism.schemas.replay import RankReport, ReplayFiles, read_replay_stats

T = TypeVar("T")


class Pacing(StrEnum):
    """Which cases are also captured paced by their slice's graph (``prism-capture-paced``)."""

    OFF = "off"
    PIPELINES = "pipelines"
    """Only cases with pp > 1, whose slice's stages compute without the waits for the other
    stages that pacing puts back (a tp or dp slice already waits in its held calls). Whether that
    brings a pipeline closer varies from run to run (docs/capture.md)."""
    ALL = "all"


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
    slice_load: bool = True
    """Run the world's other ranks beside each slice batch and paced capture
    (``prism.fidelity.load.MatchedLoad``), so the captured rank shares the machine as it does in
    the real run; False: it runs alone."""
    replay_load: bool = True
    """The same beside each replayed rank; False: it replays alone."""
    replay: bool = True
    """Also replay each role's rank against the graph (``prism-replay``): records of source 'replay'."""
    paced_load: bool = True
    """Beside a paced capture or a replay, the load ranks are replays of the same graph, so they
    wait where the real run's ranks wait (``MatchedLoad(paced_by=...)``); False: free-running."""
    paced: Pacing = Pacing.OFF
    """Which cases also capture each role again paced by the slice's graph
    (``prism-capture-paced``), build that graph and simulate it: records of source 'paced'.
    Their replay then runs against the paced graph."""
    host_ns_per_byte: Mapping[str, float] = field(default_factory=dict, hash=False)
    """The spec's host work of virtual collectives (``ClusterSpec.host_ns_per_byte``), done by the
    slice captures, the load ranks and the replays alike (``prism.peers.host_work``); empty: none."""
    hold_calls: ClusterSpec | None = None
    """The spec under whose price the slice captures' virtual calls, and their free-running load
    ranks', hold the program as the real run's calls do (``RankJob.hold_calls``); None: they
    complete at once."""
    bracket: bool = True
    """With the replay, run every rank for real right before it and again right after it, and
    take the repeat's real time as the mean of the two: a drift of the machine during the
    replay cancels to first order (the real side moved by up to 20 % between runs an hour
    apart on the 2-vCPU VM). False: one real run per repeat, first."""
    steal_limit_pct: float | None = STEAL_LIMIT_PCT
    """A real, twin or replayed run that had more of the machine's CPU time stolen is run again
    (``prism.fidelity.steal``); None: every run is kept."""
    steal_tries: int = STEAL_TRIES
    """Runs at most of one side of a repeat, the first included."""
    window_s: float | None = None
    """Seconds of clean unprofiled iterations each run's median is taken over: the warm-up of a
    case grows to span them, by a probe real run's iteration time (``windowed``); None: ``warmup``."""

    def paces(self, config: GPTConfig) -> bool:
        """Whether ``config``'s case is also captured paced."""
        return self.paced is Pacing.ALL or (self.paced is Pacing.PIPELINES and config.layout.pp > 1)


@dataclass(frozen=True, kw_only=True)
class RankRun:
    """What one repeat measured or predicted for one rank."""

    iter_ns: float
    """Steady iteration time."""
    peak_bytes: int
    """Peak memory."""
    parts_ms: dict[str, float]
    """compute / comm_wait / glue per iteration, in ms (``prism.fidelity.explain``)."""
    dynamic_bytes: int
    """Peak memory minus static bytes: what the iteration itself allocates at its peak."""
    drift_bytes: int = 0
    """Growth of Total Allocated per iteration (real runs; see ``IterationMemory``)."""
    profiled_ns: float = 0.0
    """Median wall time of the profiled iterations (real runs)."""
    bracket_ns: tuple[float, float] | None = None
    """Steady iteration time of the real runs before and after the replay (``RunSettings.bracket``),
    whose mean is ``iter_ns``; None: one real run."""
    corrected_ns: float | None = None
    """A replay's: the same iterations as ``iter_ns`` (its wall time) with the stall taken out,
    a correction shown beside the measurement."""
    phases_ms: dict[str, tuple[float, float]] | None = None
    """A replay's: per phase of the replayed rank, (measured, predicted by the graph) ms."""
    own_ms: dict[str, float] | None = None
    """Real runs and simulations: the iteration by phase (``explain.own_phases_ms``), ms."""
    blocks_ms: dict[str, float] | None = None
    """Programs: the iteration by block, each block's calls inside it (``explain.block_phases_ms``),
    ms: the split a fully real run of a program measures of itself."""
    window_ns: float = 0.0
    """Real runs: the wall time of the iterations ``iter_ns`` is the median of (bracketed: the
    shorter of the two runs')."""
    steal_pct: float | None = None
    """Real, twin and replayed runs: the share of the machine's CPU time stolen while the kept run
    ran (``prism.fidelity.steal``), in %; None: not measured."""
    tries: int = 1
    """Runs made to keep this one (more than 1: earlier ones had too much stolen)."""


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
        result = next(r.result for r in manifest.ranks if r.rank == rank)
        steady = _steady_ns(manifest, rank)
        runs[rank] = RankRun(
            iter_ns=steady,
            window_ns=float(sum(clean_unprofiled(result.iteration_ns, manifest.job.warmup))),
            own_ms=measured_phases_ms(result, settings.warmup),
            peak_bytes=static_bytes(config, config.layout.stage(rank)) + mem.peak_delta_bytes,
            parts_ms=decompose(normalize_rank(out, rank)),
            profiled_ns=_profiled_ns(manifest, rank),
            dynamic_bytes=mem.peak_delta_bytes,
            drift_bytes=mem.drift_bytes,
        )
    return runs


def bracketed(before: dict[int, RankRun], after: dict[int, RankRun]) -> dict[int, RankRun]:
    """The real runs before and after the replay as one: mean steady time and phases, the rest from
    ``before``."""
    return {
        rank: replace(
            run,
            iter_ns=(run.iter_ns + after[rank].iter_ns) / 2,
            bracket_ns=(run.iter_ns, after[rank].iter_ns),
            window_ns=min(run.window_ns, after[rank].window_ns),
            steal_pct=_most(run.steal_pct, after[rank].steal_pct),
            tries=run.tries + after[rank].tries - 1,
            own_ms=_mean_phases(run.own_ms, after[rank].own_ms),
        )
        for rank, run in before.items()
    }


def windowed(settings: RunSettings, probe: Callable[[RunSettings, Path], dict[int, RankRun]]) -> RunSettings:
    """``settings`` whose warm-up spans ``settings.window_s`` seconds of clean iterations on every
    rank, as fast as ``probe`` (one real run into the folder given, at ``settings``) ran them;
    never shorter than ``settings.warmup``."""
    if settings.window_s is None:
        return settings
    with tempfile.TemporaryDirectory(prefix="prism-window-") as tmp:
        fastest_ns = min(run.iter_ns for run in probe(settings, Path(tmp) / "probe").values())
    clean = math.ceil(settings.window_s * 1e9 / fastest_ns)
    return replace(settings, warmup=max(settings.warmup, clean + 2))  # the cold and the last aside


def _most(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else max(x for x in (a, b) if x is not None)


def unstolen(
    run: Callable[[], dict[int, RankRun]],
    settings: RunSettings,
    out: Path,
    say: Callable[[str], None] | None = None,
) -> dict[int, RankRun]:
    """``run()``'s runs, made again while the machine had more CPU time stolen than
    ``settings.steal_limit_pct`` (``prism.fidelity.steal.run_unstolen``), each with the steal it saw.
    ``out``: the folder ``run`` writes."""
    runs, stolen = run_unstolen(
        run, out=out, limit_pct=settings.steal_limit_pct, tries=settings.steal_tries, say=say
    )
    return {rank: replace(r, steal_pct=stolen.pct, tries=stolen.tries) for rank, r in runs.items()}


def _mean_phases(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None or b is None:
        return a or b
    return {phase: (a.get(phase, 0.0) + b.get(phase, 0.0)) / 2 for phase in a.keys() | b.keys()}


# -- (b) the prediction -------------------------------------------------------------------------


def build_case_graph(
    config: GPTConfig,
    capture: Path,
    graph: Path,
    spec: ClusterSpec,
    correction: Correction = Correction.PHASE,
) -> None:
    """The graph of the case's own job, built as prism-build-graph does (its dp, layers and
    microbatches, whatever the capture ran)."""
    options = BuildOptions(
        capture_dir=capture, out=graph, tp=config.tp, pp=config.pp, dp=config.dp, cluster=spec,
        microbatches=config.microbatches, layers=config.layers, profiler_correction=correction,
    )  # fmt: skip
    build_graph(options)


def predict(
    config: GPTConfig, spec: ClusterSpec, settings: RunSettings, out: Path, captured: GPTConfig | None = None
) -> tuple[dict[int, RankRun], dict[int, dict[str, float]]]:
    """Capture the slice (of ``captured``, default ``config``), build the graph of ``config`` and
    simulate it: per rank prediction, per captured rank slice split."""
    capture = out / "slice"
    captured = captured or config
    options = CaptureOptions(
        config=captured,
        real=RealMode.ROLES,
        warmup=settings.warmup,
        iterations=settings.iterations,
        out_dir=capture,
        host_ns_per_byte=settings.host_ns_per_byte,
        hold_calls=settings.hold_calls,
    )
    manifest = beside_load(
        settings, partial(run_capture, options), loaded=settings.slice_load, config=captured
    )
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
    split = breakdown(graph, result)
    parts, exposed_comm = sim_breakdown(split), split.exposed_comm_ns
    spans = result.end_ns - result.start_ns
    return {
        rank: RankRun(
            iter_ns=float(result.iteration_ns[rank]),
            own_ms=own_phases_ms(
                graph_own_ns(graph_path, rank, spans[graph.rank_rows(rank)]),
                float(result.iteration_ns[rank]),
                float(exposed_comm[rank]),
            ),
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
    beside_load(settings, pace, loaded=settings.slice_load, config=config, timed_by=pacing)
    build_case_graph(config, capture, out / PACED_GRAPH, spec)
    return _simulated(config, out / PACED_GRAPH, settings)


def beside_load(
    settings: RunSettings,
    run: Callable[..., T],
    *,
    loaded: bool,
    config: GPTConfig | None = None,
    program: ProgramSpec | None = None,
    timed_by: Path | None = None,
) -> T:
    """``run(hooks=...)``, beside the world's other ranks (``MatchedLoad``: of the built-in GPT's
    ``config`` or of a user's ``program``, each doing the spec's host work) if ``loaded`` (the
    settings' ``slice_load`` or ``replay_load``): free-running ones, or, for the GPT, replays of
    ``timed_by`` (the graph that times the run) if ``settings.paced_load``."""
    if not loaded:
        return run(hooks=None)
    paced_by = timed_by if settings.paced_load else None
    with MatchedLoad(
        config, program=program, warmup=settings.warmup, iterations=settings.iterations, paced_by=paced_by,
        host_ns_per_byte=settings.host_ns_per_byte, hold_calls=settings.hold_calls,
    ) as load:  # fmt: skip
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
        host_work=bool(settings.host_ns_per_byte),
    )  # fmt: skip
    report = beside_load(
        settings,
        partial(run_replay, options),
        loaded=settings.replay_load,
        config=config,
        timed_by=out / graph,
    )
    return {
        r.rank: replayed_run(r, static_bytes(config, r.stage), out / "replay", settings.warmup)
        for r in report.ranks
    }


def replayed_run(report: RankReport, static: int, replay_dir: Path, warmup: int) -> RankRun:
    """A replayed rank as a ``RankRun``: its wall time is the measurement, split by phase as a
    real rank's is (from the files in ``replay_dir``, over the iterations the report counts)."""
    wall_ns = report.wall_iter_ms * 1e6
    files = ReplayFiles(replay_dir)
    result = RankResult.from_dict(json.loads(files.result(report.rank).read_text()))
    skip = read_replay_stats(files.replay_stats(report.rank)).simulated_from
    return RankRun(
        iter_ns=wall_ns,
        corrected_ns=report.measured_iter_ms * 1e6,
        peak_bytes=int(report.measured_peak_bytes),
        parts_ms={},
        dynamic_bytes=int(report.measured_peak_bytes) - static,
        phases_ms={p.phase: (p.measured_ms, p.predicted_ms) for p in report.phases},
        own_ms=measured_phases_ms(result, warmup, skip),
        blocks_ms=measured_blocks_ms(result.block_ns, result.iteration_ns, warmup, skip),
    )
