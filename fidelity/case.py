"""One fidelity case end to end: its repeats, each side in turn, paired into records."""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from prism.capture.workloads.gpt.config import GPTConfig
from prism.fidelity.cases import case_label
from prism.fidelity.compare import breakdown_rows, paired_records
from prism.fidelity.explain import summarize_latencies
from prism.fidelity.measure import (
    PACED_GRAPH,
    RankRun,
    RunSettings,
    bracketed,
    measure_real,
    predict,
    predict_paced,
    replay_roles,
    unstolen,
    windowed,
)
from prism.graph.comm.call_latency import capture_latencies
from prism.schemas.cluster import ClusterSpec

Progress = Callable[[str], None]


@dataclass(kw_only=True)
class CaseResult:
    """Everything one case produced."""

    records: list[dict]
    """One per rank: the benchmark's table."""
    breakdown: list[dict] = field(default_factory=list)
    """One per rank: where the iteration goes, real vs slice vs simulation (ms, medians)."""
    collectives: list[dict] = field(default_factory=list)
    """Real gloo collectives of the real runs: latency and skew vs the comm model."""


CASE_DIR_CHARS = 120
"""Longest folder name a case gets from its label: file systems allow 255 bytes, and a program's
command line (torchtitan's options) runs longer."""


def case_dir(work_dir: Path, label: str) -> Path:
    """Where a case's repeats are kept under ``--work-dir`` (``repeat0``, ``repeat1``, ...): its
    label, or where that is too long a name, its start and a digest of the whole."""
    name = label.replace(" ", "_").replace("=", "")
    if len(name.encode()) > CASE_DIR_CHARS:
        digest = hashlib.sha1(label.encode()).hexdigest()[:12]
        name = f"{name.encode()[: CASE_DIR_CHARS - 13].decode(errors='ignore')}-{digest}"
    return work_dir / name


@contextmanager
def repeat_dir(settings: RunSettings, label: str, repeat: int) -> Iterator[Path]:
    """Where one repeat of a case runs: kept under ``--work-dir`` (``case_dir``), else a
    temporary directory removed after it."""
    if settings.work_dir is None:
        with tempfile.TemporaryDirectory(prefix="prism-fidelity-") as tmp:
            yield Path(tmp)
        return
    path = case_dir(settings.work_dir, label) / f"repeat{repeat}"
    path.mkdir(parents=True, exist_ok=False)
    yield path


def fit_window(settings: RunSettings, probe, label: str, say: Progress) -> RunSettings:
    """``settings`` with the warm-up that spans ``settings.window_s`` (``measure.windowed``)."""
    if settings.window_s is None:
        return settings
    say(f"[{label}] a probe real run, for the warm-up that spans {settings.window_s:g} s")
    fitted = windowed(settings, probe)
    say(f"[{label}] warm-up {fitted.warmup} iterations")
    return fitted


def run_case_detailed(
    config: GPTConfig,
    repeats: int,
    spec: ClusterSpec,
    settings: RunSettings | None = None,
    progress: Progress | None = None,
    captured: GPTConfig | None = None,
) -> CaseResult:
    """Measure and predict ``config`` ``repeats`` times (real run and slice interleaved) and pair
    them; the slice captures ``captured`` (default: ``config``) and the graph is built for ``config``."""
    say = progress or (lambda _: None)
    label = case_label(config, captured)
    settings = fit_window(settings or RunSettings(), partial(measure_real, config), label, say)
    real, pred, paced, replayed, slices, latencies = [], [], [], [], [], []
    for repeat in range(repeats):
        with repeat_dir(settings, label, repeat) as root:
            step = f"[{label}] repeat {repeat + 1}/{repeats}:"
            bracket = settings.replay and settings.bracket

            def real_run(name: str, root: Path = root) -> dict[int, RankRun]:
                return unstolen(
                    partial(measure_real, config, settings, root / name), settings, root / name, say
                )

            if not bracket:
                say(f"{step} every rank real")
                real.append(real_run("real"))
            say(f"{step} slice capture, build, simulate")
            predicted, slice_parts = predict(config, spec, settings, root, captured)
            pred.append(predicted)
            slices.append(slice_parts)
            graph = "graph.parquet"
            if settings.paces(config):
                say(f"{step} paced capture, build, simulate")
                paced.append(predict_paced(config, spec, settings, root))
                graph = PACED_GRAPH
            if bracket:
                say(f"{step} every rank real (before the replay)")
                before = real_run("real")
            if settings.replay:
                say(f"{step} replay of each role's rank against {graph}")
                replay = partial(replay_roles, config, settings, root, graph)
                replayed.append(unstolen(replay, settings, root / "replay", say))
            if bracket:
                say(f"{step} every rank real (after the replay)")
                real.append(bracketed(before, real_run("real_after")))
            latencies += capture_latencies(root / "real")
    return CaseResult(
        records=paired_records(label, real, pred)
        + paired_records(label, real, paced, "paced")
        + paired_records(label, real, replayed, "replay"),
        breakdown=breakdown_rows(label, config, real, pred, slices, captured),
        collectives=[{"case": label, **row} for row in summarize_latencies(latencies, spec)],
    )


def run_case(
    case_config: GPTConfig, repeats: int, spec: ClusterSpec, settings: RunSettings | None = None
) -> list[dict]:
    """One record per rank of ``case_config``: real vs predicted iteration time and peak memory."""
    return run_case_detailed(case_config, repeats, spec, settings).records
