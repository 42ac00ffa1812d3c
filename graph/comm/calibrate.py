"""Calibrate the ``local`` cluster spec: time real gloo collectives here, fit α and β per op class.

The local machine is treated as one node of ``procs`` GPUs. For every op class c the samples are
fitted by least squares to ``T = hops·α_c + volume·β_c`` (hops and volume from
``prism.peers.comm_model.single_node_terms``, so the fit speaks the cost model's language), then turned
into a spec: p2p is the reference link (``α = α_p2p``, ``B = 1/β_p2p``) and every other class gets
``latency_factor = α_c/α_p2p`` and ``bandwidth_efficiency = β_p2p/β_c``; the model built from the
spec then reproduces each class's fitted line exactly. Times span several decades between 4 KiB
and 16 MiB, so rows are weighted by 1/T: the fit minimises *relative* error, otherwise the
largest sizes alone would set α.

With ``measured_table`` (``prism-calibrate --table``) the microbenchmark's points are also
written as they are into the spec's ``measured`` table: calls within one node are then priced
by interpolating them, the line serving only to extend them (past the largest size) and for
groups across nodes. Calibrated at the job's own sizes (``--sizes``), that prices its calls as
measured, where no line fits (a tiny gloo all-reduce can cost more than a larger one).

Samples come from a microbenchmark (``run_benchmark``) and optionally from the comm logs of a
``--real all`` capture (``samples_from_comm_logs``), whose delegated calls ran on real gloo groups:
timed like the microbenchmark's, from the last member's arrival, over the clean unprofiled
iterations.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from prism.graph.comm.bench import CalibrationError, Sample, run_benchmark, run_busy_benchmark
from prism.graph.comm.call_latency import LoggedCalls, call_latencies, capture_logs
from prism.graph.comm.wake_bench import run_wake_benchmark, wake_table
from prism.peers.comm_model import OPS, CommModel, op_class, single_node_terms
from prism.schemas.cluster import OP_CLASSES, ClusterSpec, local_path
from prism.schemas.comm_log import read_comm_log
from prism.schemas.iterations import MIN_WARMUP
from prism.schemas.manifest import COMM_DIR, MANIFEST_FILE, read_manifest

KiB, MiB = 2**10, 2**20
DEFAULT_SIZES = (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB)
BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather", "scatter", "barrier", "send")  # fmt: skip


_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def parse_size(text: str) -> int:
    """'4KiB', '16M', '4096' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read size {text!r}; write e.g. 4096, 64KiB, 16MiB")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


@dataclass(frozen=True, kw_only=True)
class ClassFit:
    """Fitted α and β of one op class."""

    alpha_s: float
    """Latency per hop (seconds)."""
    beta_s_per_byte: float
    """Seconds per byte of volume (1/bandwidth); 0 for barrier."""
    samples: int
    """Samples the fit used."""


@dataclass(frozen=True, kw_only=True)
class CalibrationFit:
    """Per-class fits, and the classes that could not be fitted with the reason."""

    classes: dict[str, ClassFit]
    """Fitted classes by OP_CLASSES key."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Class -> why it was not fitted (it keeps factor 1.0 in the spec)."""

    def to_spec(self, *, gpus_per_node: int, name: str = "local", notes: str = "") -> ClusterSpec:
        """One-node spec whose model reproduces every fitted class (inter-node = intra-node)."""
        with_bw = [c for c in OP_CLASSES if c in self.classes and self.classes[c].beta_s_per_byte > 0]
        if not with_bw:
            raise CalibrationError("no op class with a bandwidth could be fitted; use larger sizes")
        ref = self.classes["p2p" if "p2p" in with_bw else with_bw[0]]
        alpha = ref.alpha_s if ref.alpha_s > 0 else max(f.alpha_s for f in self.classes.values())
        efficiency = {
            c: ref.beta_s_per_byte / f.beta_s_per_byte
            for c, f in self.classes.items()
            if f.beta_s_per_byte > 0
        }
        factor = {c: f.alpha_s / alpha for c, f in self.classes.items()} if alpha > 0 else {}
        for table in (efficiency, factor):  # on one node the tree must never undercut the ring
            if "all_reduce" in table:
                table["all_reduce_tree"] = table["all_reduce"]
        bw = 1.0 / ref.beta_s_per_byte
        return ClusterSpec(
            name=name, gpus_per_node=gpus_per_node, intra_bandwidth_bytes_per_s=bw, intra_latency_s=alpha,
            inter_bandwidth_bytes_per_s=bw, inter_latency_s=alpha, bandwidth_efficiency=efficiency,
            latency_factor=factor, notes=notes,
        )  # fmt: skip


# -- fitting ---------------------------------------------------------------------------------


def fit_samples(samples: Iterable[Sample]) -> CalibrationFit:
    """Weighted (relative-error) least squares of ``T = hops·α + volume·β`` per op class."""
    by_class: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.seconds > 0 and (s.group_size > 1 or op_class(s.op) == "p2p"):
            by_class[op_class(s.op)].append(s)
    classes, skipped = {}, {}
    for cls, rows in by_class.items():
        try:
            classes[cls] = _fit_class(cls, rows)
        except CalibrationError as e:
            skipped[cls] = str(e)
    return CalibrationFit(classes=classes, skipped=skipped)


def _fit_class(cls: str, rows: list[Sample]) -> ClassFit:
    hops, volume = (np.concatenate(a) for a in zip(*(_terms(s) for s in rows), strict=True))
    t = np.array([s.seconds for s in rows])
    columns = [hops] if cls == "barrier" else [hops, volume]
    coef = _lstsq(np.stack(columns, axis=1), t)
    if len(coef) == 2 and coef[0] < 0:  # negative latency is noise: refit the slope alone
        coef = np.array([0.0, *_lstsq(volume[:, None], t)])
    if len(coef) == 2 and coef[1] <= 0:
        raise CalibrationError("time does not grow with size; measure larger sizes")
    alpha, beta = float(max(coef[0], 0.0)), float(coef[1]) if len(coef) == 2 else 0.0
    return ClassFit(alpha_s=alpha, beta_s_per_byte=beta, samples=len(rows))


def _terms(s: Sample) -> tuple[np.ndarray, np.ndarray]:
    return single_node_terms(s.op, np.array([s.bytes]), np.array([s.group_size]))


def _lstsq(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    weighted = a / t[:, None]  # row i divided by T_i: residuals become relative errors
    if np.linalg.matrix_rank(weighted) < a.shape[1]:
        raise CalibrationError("needs samples at two or more sizes or group sizes")
    coef, *_ = np.linalg.lstsq(weighted, np.ones_like(t), rcond=None)
    return coef


def samples_from_comm_logs(runs: Iterable[Sequence[LoggedCalls]]) -> list[Sample]:
    """Mean latency after the last member arrived per (op, bytes, group size) of the delegated
    calls whose members' logs are all given (one node assumed), as the microbenchmark times
    its points: one log's call durations would also charge the job's arrival skew. ``runs``:
    each run's logs, one per rank (``read_comm_logs``)."""
    latencies: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    for c in (c for logs in runs for c in call_latencies(logs)):
        if c.op in OPS:
            latencies[(c.op, c.bytes, c.group_size)].append(c.latency_ns / 1e9)
    return [
        Sample(op=op, bytes=n, group_size=p, seconds=statistics.fmean(t), source="comm_log", count=len(t))
        for (op, n, p), t in sorted(latencies.items())
    ]


def fit_from_comm_logs(runs: Iterable[Sequence[LoggedCalls]]) -> CalibrationFit:
    """Fit α and β per op class from the delegated calls of comm logs alone."""
    return fit_samples(samples_from_comm_logs(runs))


def read_comm_logs(paths: Iterable[Path]) -> list[list[LoggedCalls]]:
    """Comm logs by run: each capture directory's (its ``comm/rank*.comm.json``), then the loose
    files together. Each log comes with the mask of the calls to keep: a capture's clean
    unprofiled iterations (its manifest says which), every call of a loose file."""
    runs: list[list[LoggedCalls]] = []
    loose: list[LoggedCalls] = []
    for path in map(Path, paths):
        if not path.exists():
            raise CalibrationError(f"no capture directory or comm log at {path}")
        if not path.is_dir():
            loose.append((read_comm_log(path), None))
            continue
        job = read_manifest(path).job if (path / MANIFEST_FILE).exists() else None
        if job is not None and job.warmup < MIN_WARMUP:
            raise CalibrationError(
                f"{path} has no clean unprofiled iteration to time calls in (warm-up {job.warmup}; "
                f"capture with --warmup {MIN_WARMUP} or more)"
            )
        run = capture_logs(path)
        if not run:
            raise CalibrationError(f"no comm logs under {path / COMM_DIR}")
        runs.append(run)
    return runs + ([loose] if loose else [])


# -- the whole calibration -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig:
    """What to measure and where to write the spec."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    """Bytes per rank (comm-log meaning) to time each op at."""
    max_procs: int = max(2, min(4, os.cpu_count() or 2))
    """Processes to spawn; group sizes are the powers of two from 2 up to it."""
    ops: tuple[str, ...] = BENCH_OPS
    """Ops to time ('send' times one-way transfers, the receiver waiting for the sender)."""
    reps: int = 9
    """Timed repetitions per point (the mean latency over their calls is kept)."""
    calls_per_rep: int = 3
    """Calls per repetition, each timed (back to back, or each after ``compute_between_ms``)."""
    warmup: int = 2
    """Untimed repetitions before the timed ones."""
    timeout_s: float = 300.0
    """Seconds before the benchmark processes are killed."""
    comm_logs: tuple[Path, ...] = ()
    """Comm-log files or capture directories whose delegated calls join the fit."""
    bench: bool = True
    """Run the microbenchmark; False fits the comm logs' calls alone (a real job's calls, each
    from its last member's arrival, price its comm as it runs; the microbenchmark's points carry
    the spell of the VM they were timed in)."""
    out: Path | None = None
    """Spec file to write; None writes the 'local' path."""
    gpus_per_node: int | None = None
    """'GPUs' per node of the spec; None: max(max_procs, CPU count), as every local rank shares this node."""
    compute_between_ms: float = 0.0
    """> 0: time cold calls, each after this much compute (``calibrate_bench``)."""
    busy_rounds: int = 0
    """> 0: also time 2-member all-reduces of each size with both members computing through them,
    against idle, over this many rounds (``bench.run_busy_benchmark``), and write the ratio of the
    means into the spec's ``busy_call`` table (CPU test beds: gloo's exchanges need the cores the
    members compute on)."""
    wake_gaps_ms: tuple[float, ...] = ()
    """Also time compute right after a wait of about each of these (ms) for a computing neighbour,
    against back to back (``wake_bench.run_wake_benchmark``), and write the spec's
    ``wake_compute`` table."""
    wake_rounds: int = 100
    """Rounds of the wake benchmark (each goes through every gap once)."""
    measured_table: bool = False
    """Write the timed points into the spec's ``measured`` table, so that calls within one node
    are priced from them (interpolated) rather than from the fitted α-β line. Off by default:
    on a shared VM each point carries the machine's spell at the moment it was timed (64 KiB:
    1.55 ms in one calibration, 1.97 in the next), which a line through all sizes averages out;
    where calls are steady but not linear in size (NCCL's protocol switches) the table is the
    better price."""

    def __post_init__(self) -> None:
        if self.max_procs < 2:
            raise ValueError(f"max_procs must be at least 2, got {self.max_procs}")
        if not self.sizes or min(self.sizes) < 4:
            raise ValueError("sizes must be given and at least 4 bytes each")
        unknown = sorted(set(self.ops) - set(BENCH_OPS))
        if unknown:
            raise ValueError(f"cannot time op(s) {', '.join(unknown)}; known: {', '.join(BENCH_OPS)}")
        if self.reps < 1 or self.calls_per_rep < 1 or self.warmup < 0:
            raise ValueError("reps and calls_per_rep must be positive, warmup non-negative")
        if not self.ops:
            raise ValueError("--ops names no op to time")
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"the timeout must be a positive number of seconds, got {self.timeout_s}")
        if not self.compute_between_ms >= 0 or math.isinf(self.compute_between_ms):  # nan too
            raise ValueError(f"compute_between_ms must be 0 or more, got {self.compute_between_ms}")
        if self.busy_rounds < 0:
            raise ValueError(f"busy_rounds must be 0 (off) or more, got {self.busy_rounds}")
        if any(not g > 0 or math.isinf(g) for g in self.wake_gaps_ms) or self.wake_rounds < 1:
            raise ValueError("wake gaps must be positive ms and wake rounds at least 1")
        if not self.bench and not self.comm_logs:
            raise ValueError("without the microbenchmark there is nothing to fit: give --capture")
        if not self.bench and (self.measured_table or self.compute_between_ms or self.busy_rounds):
            raise ValueError(
                "--busy-rounds, --table and --compute-between-ms time the microbenchmark: not with --no-bench"
            )


@dataclass(frozen=True, kw_only=True)
class Check:
    """A sample against the fitted model."""

    sample: Sample
    """What was measured."""
    predicted_s: float
    """What the fitted spec's CommModel predicts."""

    @property
    def rel_error(self) -> float:
        return abs(self.predicted_s - self.sample.seconds) / self.sample.seconds


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """The fitted spec, where it was written, and how well it predicts the samples."""

    spec: ClusterSpec
    """The 'local' spec."""
    fit: CalibrationFit
    """Per-class α and β."""
    checks: tuple[Check, ...]
    """Every sample with the fitted α-β line's prediction (the ``measured`` table left out)."""
    path: Path
    """Where the spec was written."""

    @property
    def median_rel_error(self) -> float:
        return statistics.median(c.rel_error for c in self.checks)


HOST_FIT_MIN_BYTES = 1 * MiB
"""Smallest call the host-work fit uses: below it a call's fixed costs (waking gloo's threads,
the socket's round trips) outweigh the work per byte this table models."""


def host_work_table(samples: Iterable[Sample]) -> dict[str, float]:
    """The spec's ``host_ns_per_byte``: per collective class, the CPU time per byte a member's
    process spent in the microbenchmark's calls of at least ``HOST_FIT_MIN_BYTES``, fitted
    through the origin (least squares). Transfers are left out: a virtual peer's host work is a
    collective's share of copying and reducing, which a transfer's peer does not do on this rank."""
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for s in samples:
        cls = op_class(s.op)
        if (
            s.source == "bench"
            and s.cpu_seconds is not None
            and s.bytes >= HOST_FIT_MIN_BYTES
            and cls != "p2p"
        ):
            points[cls].append((s.bytes, s.cpu_seconds * 1e9))
    return {
        cls: sum(n * ns for n, ns in pts) / sum(n * n for n, _ in pts) for cls, pts in sorted(points.items())
    }


def measured_table(samples: Iterable[Sample]) -> dict[str, dict[int, tuple[tuple[int, float], ...]]]:
    """The spec's ``measured`` table of microbenchmark samples: op class -> group size -> points."""
    table: dict[str, dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        if s.source == "bench" and s.group_size > 1:
            table[op_class(s.op)][s.group_size].append((s.bytes, s.seconds))
    return {cls: {p: tuple(sorted(points)) for p, points in sizes.items()} for cls, sizes in table.items()}


def check_samples(spec: ClusterSpec, samples: list[Sample]) -> tuple[Check, ...]:
    model = CommModel(spec)
    return tuple(
        Check(sample=s, predicted_s=model.duration_ns(s.op, s.bytes, s.group_size, 1) / 1e9) for s in samples
    )


def calibrate(config: CalibrationConfig) -> CalibrationResult:
    """Time collectives here, add comm-log samples, fit, write the spec, check it."""
    runs = read_comm_logs(config.comm_logs)
    measured = []
    if config.bench:
        measured = run_benchmark(
            max_procs=config.max_procs, sizes=config.sizes, ops=config.ops, reps=config.reps,
            calls_per_rep=config.calls_per_rep, warmup=config.warmup, timeout_s=config.timeout_s,
            compute_between_s=config.compute_between_ms / 1e3,
        )  # fmt: skip
    logged = samples_from_comm_logs(runs)
    if runs and not logged:
        raise CalibrationError(
            "the --capture paths hold no delegated call whose every member was logged (a --real all "
            "capture has them; a capture of roles runs its peers virtually)"
        )
    samples = measured + logged
    fit = fit_samples(samples)
    where = (
        f"calibrated by prism-calibrate on {os.uname().nodename} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"
    )
    if config.bench:
        notes = f"{where}: gloo, {config.max_procs} processes, {len(samples)} samples" + (
            f", cold calls after {config.compute_between_ms:g} ms of compute"
            if config.compute_between_ms
            else ""
        )
    else:
        notes = f"{where}: the delegated calls of {len(runs)} captured run(s), {len(samples)} samples, each call from its last member's arrival"
    gpus_per_node = config.gpus_per_node or max(config.max_procs, os.cpu_count() or 1)
    line = fit.to_spec(gpus_per_node=gpus_per_node, notes=notes)
    spec = line
    host = host_work_table(measured)
    if host:
        spec = replace(
            spec, host_ns_per_byte=host, notes=spec.notes + "; host work per byte of calls from 1 MiB"
        )
    if config.measured_table:
        spec = replace(
            spec, measured=measured_table(measured), notes=spec.notes + "; measured table of its sizes"
        )
    if config.busy_rounds:
        busy = run_busy_benchmark(
            sizes=config.sizes, rounds=config.busy_rounds, warmup=config.warmup, timeout_s=config.timeout_s
        )
        spec = replace(
            spec,
            busy_call={str(s.bytes): s.factor for s in busy},
            notes=spec.notes + f"; all-reduces beside compute over {config.busy_rounds} rounds",
        )
    if config.wake_gaps_ms:
        wake = run_wake_benchmark(
            gaps_ms=config.wake_gaps_ms, rounds=config.wake_rounds, timeout_s=config.timeout_s
        )
        spec = replace(
            spec,
            wake_compute=wake_table(wake),
            notes=spec.notes
            + f"; compute after waits of {', '.join(f'{g:g}' for g in config.wake_gaps_ms)} ms",
        )
    path = spec.save(config.out or local_path())
    # Checked against the α-β line alone: the measured table would reproduce its own points.
    return CalibrationResult(spec=spec, fit=fit, checks=check_samples(line, samples), path=path)
