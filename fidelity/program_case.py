"""Fidelity of a user's program: its simulated graph against the program itself under torchrun.

Each repeat, in turn:

(a) the real run: ``torchrun --nproc-per-node WORLD -m prism.fidelity.timed_run -- PROGRAM``,
    every rank real on plain gloo (``prism.fidelity.timed_run``): per rank its steady iteration
    time (median of the clean unprofiled warm-up iterations) and its peak memory = the live
    tensor bytes when the memory-profiled iterations began + the median of their peak
    ``Total Allocated`` above the level they began at, the first of them left out (the profiler
    sees no free of what was allocated before it started);
(b) the prediction: ``prism-capture`` of the program (or of the same model at fewer layers, built
    at the program's count: ``captured_argv``) at the same layout (one rank per pipeline
    position, each alone with its peers virtual; by default beside the world's other ranks run
    as lone captures of their own, ``prism.fidelity.load``, since in the real run they share this
    machine), ``prism-build-graph`` at that layout, and the simulation of every rank's iteration
    and peak memory;
(c) with ``settings.replay``, the replay: each captured rank run for real against that graph
    (``prism-replay``, one at a time, beside the same load), its wall time the measurement.

The records pair them rank by rank (``prism.fidelity.compare.paired_records``; sources
``simulation`` and ``replay``), each with the iteration split by block (``block_err``: forward,
backward, optimizer, each with the calls made inside it, and the rest), measured the same way on
the real run and the replay (the capture's phase marks) and taken from the simulated pass; the
timing hook's and the marks' own cost per iteration are reported beside them.
"""

from __future__ import annotations

import os
import re
import shlex
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from prism.capture.runner import CaptureOptions, RealMode, run_capture
from prism.fidelity.case import fit_window, repeat_dir
from prism.fidelity.compare import paired_records
from prism.fidelity.explain import block_phases_ms, measured_blocks_ms, sim_breakdown
from prism.fidelity.measure import RankRun, RunSettings, beside_load, replayed_run, unstolen
from prism.fidelity.timed_run import TimedRun, result_path, trace_path
from prism.fidelity.torchrun import torchrun_command
from prism.graph.build.builder import BuildOptions, build_graph
from prism.graph.io.parquet import read_metadata
from prism.graph.sim.load import load_sim_graph, rank_static_bytes
from prism.graph.sim.metrics import breakdown
from prism.graph.sim.simulate import simulate
from prism.graph.traces.memory import iteration_memory
from prism.replay.cosim import predicted_phase_ns
from prism.replay.rank_program import RankProgram
from prism.replay.runtime import ReplayOptions, least_warmup, run_replay
from prism.schemas.cluster import ClusterSpec
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import read_manifest
from prism.schemas.program import ProgramSpec

Progress = Callable[[str], None]


class ProgramRunFailed(RuntimeError):
    """The program's real run under torchrun failed."""


@dataclass(frozen=True, kw_only=True)
class ProgramCase:
    """A program and the layout it runs at, whole, on this machine."""

    argv: tuple[str, ...]
    """``("train.py", *args)`` or ``("-m", "package.module", *args)``."""
    layout: ParallelLayout
    device: str = "cpu"
    """Where the program runs, real and captured alike: cpu, or cuda (one GPU per rank)."""
    captured_argv: tuple[str, ...] | None = None
    """What the slice captures instead of ``argv`` (the same model at fewer layers), its graph
    built at ``layers`` (``prism-build-graph --layers``); None: ``argv`` itself."""
    layers: int | None = None
    """The layer count the graph is built at from ``captured_argv``'s capture."""

    @property
    def label(self) -> str:
        more = "".join(f" {axis}={n}" for axis, n in self.layout.extra_axes().items())  # cp, ep, ...
        built = (
            f" built at {self.layers} layers from {shlex.join(self.captured_argv)}"
            if self.captured_argv
            else ""
        )
        return f"{shlex.join(self.argv)}{built} (tp={self.layout.tp} pp={self.layout.pp} dp={self.layout.dp}{more})"


@dataclass(kw_only=True)
class ProgramCaseResult:
    records: list[dict]
    """One per rank: real vs predicted iteration time and peak memory."""
    hook: list[dict]
    """One per rank: the timing hook's cost per iteration in the real runs."""


RANK_LINE = re.compile(r"\[default\d+\]:")
"""How torchrun's ``--tee`` prefixes a rank's output lines."""


def measure_real_program(
    case: ProgramCase, settings: RunSettings, out: Path
) -> tuple[dict[int, RankRun], dict]:
    """Run every rank of ``case`` under torchrun; per rank its run, and the hook's cost."""
    world = case.layout.world_size
    command = torchrun_command(
        world, out / "torchrun",
        "-m", "prism.fidelity.timed_run", "--out", str(out),
        "--warmup", str(settings.warmup), "--iterations", str(settings.iterations), "--device", case.device,
        "--", *case.argv,
        tee=True,
    )  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}  # what torchrun sets for several processes per node
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        lines = (done.stdout + done.stderr).splitlines()
        tail = "\n".join(([line for line in lines if RANK_LINE.match(line)] or lines)[-30:])
        raise ProgramRunFailed(f"the real run of {case.label} failed (exit {done.returncode}):\n{tail}")
    runs, hooks = {}, {}
    for rank in range(world):
        timed = TimedRun.read(result_path(out, rank))
        clean = clean_unprofiled(timed.iteration_ns, settings.warmup)
        memory = iteration_memory(trace_path(out, rank), after_first=True)
        runs[rank] = RankRun(
            iter_ns=float(statistics.median(clean)),
            window_ns=float(sum(clean)),
            peak_bytes=timed.static_bytes + memory.peak_delta_bytes,
            parts_ms={},
            dynamic_bytes=memory.peak_delta_bytes,
            drift_bytes=memory.drift_bytes,
            blocks_ms=measured_blocks_ms(timed.block_ns, timed.iteration_ns, settings.warmup),
        )
        clean_marks = clean_unprofiled(timed.marks_ns, settings.warmup)
        hooks[rank] = (
            statistics.median(timed.hook_ns[: settings.warmup]),
            statistics.median(clean_marks) if clean_marks else None,
        )
    return runs, hooks


def predict_program(
    case: ProgramCase, spec: ClusterSpec, settings: RunSettings, out: Path
) -> dict[int, RankRun]:
    """Capture the program (or ``case.captured_argv``) at its layout, build its graph at that
    layout (at ``case.layers`` layers), simulate every rank."""
    argv = case.captured_argv or case.argv
    program = ProgramSpec(argv=argv, cwd=os.getcwd(), layout=case.layout, device=case.device)
    capture = out / "capture"
    options = CaptureOptions(
        program=program, real=RealMode.ROLES, warmup=settings.warmup, iterations=settings.iterations,
        out_dir=capture, host_ns_per_byte=settings.host_ns_per_byte, hold_calls=settings.hold_calls,
    )  # fmt: skip
    beside_load(settings, partial(run_capture, options), loaded=settings.slice_load, program=program)
    graph_path = out / "graph.parquet"
    layout = case.layout
    build_graph(
        BuildOptions(
            capture_dir=capture,
            out=graph_path,
            tp=layout.tp,
            pp=layout.pp,
            dp=layout.dp,
            cluster=spec,
            layers=case.layers,
        )
    )
    graph = load_sim_graph(graph_path)
    result = simulate(graph, iterations=settings.sim_iterations)
    parts = sim_breakdown(breakdown(graph, result))
    return {
        rank: RankRun(
            iter_ns=float(result.iteration_ns[rank]),
            peak_bytes=int(result.peak_bytes[rank]),
            parts_ms=parts[rank],
            dynamic_bytes=int(result.peak_bytes[rank]) - int(graph.static_bytes[rank]),
            # As the replay's clock splits a pass: each node's time, a call's wait with it.
            blocks_ms=block_phases_ms(
                predicted_phase_ns(graph, result, RankProgram.read(graph_path, rank)),
                float(result.iteration_ns[rank]),
            ),
        )
        for rank in range(graph.ranks)
    }


def replay_program(case: ProgramCase, settings: RunSettings, out: Path) -> dict[int, RankRun]:
    """Replay each rank ``predict_program`` captured against the graph it built in ``out``."""
    ranks = tuple(sorted(r.rank for r in read_manifest(out / "capture").ranks))
    # The replay's own warm-up: at least what its graph needs (a program whose calls turn steady
    # late, under a short --warmup).
    warmup = max(settings.warmup, least_warmup(read_metadata(out / "graph.parquet")))
    options = ReplayOptions(
        graph=out / "graph.parquet", ranks=ranks, out_dir=out / "replay", warmup=warmup,
        iterations=settings.iterations, separately=True,
        host_work=bool(settings.host_ns_per_byte),
        program=case.argv if case.captured_argv else (),  # a graph built at another count: the program at it
    )  # fmt: skip
    program = ProgramSpec(argv=case.argv, cwd=os.getcwd(), layout=case.layout, device=case.device)
    report = beside_load(settings, partial(run_replay, options), loaded=settings.replay_load, program=program)
    static = rank_static_bytes(read_metadata(out / "graph.parquet"), case.layout, ranks)
    return {
        r.rank: replayed_run(r, int(static[ranks.index(r.rank)]), out / "replay", warmup)
        for r in report.ranks
    }


def real_program_runs(case: ProgramCase, settings: RunSettings, out: Path) -> dict[int, RankRun]:
    """Every rank's run of ``measure_real_program``."""
    return measure_real_program(case, settings, out)[0]


def run_program_case(
    case: ProgramCase,
    repeats: int,
    spec: ClusterSpec,
    settings: RunSettings | None = None,
    progress: Progress | None = None,
) -> ProgramCaseResult:
    """Run ``case`` for real and predict it, ``repeats`` times interleaved, and pair them."""
    say = progress or (lambda _: None)
    settings = fit_window(settings or RunSettings(), partial(real_program_runs, case), case.label, say)
    real, pred, replayed, hooks = [], [], [], []
    for repeat in range(repeats):
        with repeat_dir(settings, case.label, repeat) as root:
            step = f"[{case.label}] repeat {repeat + 1}/{repeats}:"
            say(f"{step} every rank real under torchrun")
            kept: dict = {}  # the hook's cost of the run kept

            def real_run(root: Path = root, kept: dict = kept) -> dict[int, RankRun]:
                runs, kept["hook"] = measure_real_program(case, settings, root / "real")
                return runs

            real.append(unstolen(real_run, settings, root / "real", say))
            hooks.append(kept["hook"])
            say(f"{step} capture, build, simulate")
            pred.append(predict_program(case, spec, settings, root))
            if settings.replay:
                say(f"{step} replay of each captured rank")
                replay = partial(replay_program, case, settings, root)
                replayed.append(unstolen(replay, settings, root / "replay", say))
    hook_rows = []
    for rank in sorted(real[0]):
        hook_ns = statistics.median(h[rank][0] for h in hooks)
        marks = [h[rank][1] for h in hooks if h[rank][1] is not None]
        marks_ns = statistics.median(marks) if marks else None
        iter_ns = statistics.median(r[rank].iter_ns for r in real)
        hook_rows.append(
            {"case": case.label, "rank": rank, "hook_us": round(hook_ns / 1e3, 1),
             "hook_pct_of_iter": round(100 * hook_ns / iter_ns, 3),
             "marks_us": None if marks_ns is None else round(marks_ns / 1e3, 1),
             "marks_pct_of_iter": None if marks_ns is None else round(100 * marks_ns / iter_ns, 3)}
        )  # fmt: skip
    records = paired_records(case.label, real, pred) + paired_records(case.label, real, replayed, "replay")
    return ProgramCaseResult(records=records, hook=hook_rows)
