"""The replay runtime: run real ranks of the graph's job against its virtual participants.

For each ``--rank``, one process runs the original program (the built-in GPT workload with the
target job's shapes, as recorded in the graph's metadata, or the user's own program the graph
was captured from, or another one given) as that rank of the full world, its peers virtual and
timed by the co-simulation (``prism.replay.rank_main``).

Several ranks run at once, spawned like torchrun: one co-simulation (``prism.replay.coordinator``,
a thread of this process) takes all of their arrivals; a group whose members are all real runs
on gloo (CPU) or NCCL (CUDA) with real data, a transfer between two real ranks too, and a
group that mixes real and virtual members completes at the co-simulated time. With
``separately``, they run one after another instead, each the only real rank of its run.

Inputs are checked before anything starts (``ReplayInputError``: one line, the CLI's exit 2):
a file that is not a graph of this version, a rank outside the world, a program that cannot
start here (unknown workload, CUDA without a device, too few warm-up iterations after a
program's set-up iterations).
"""

from __future__ import annotations

import base64
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prism.capture.launch import LaunchError, RankLaunch, run_processes
from prism.capture.runner import CaptureHooks
from prism.graph.io.parquet import GraphFormatError, read_metadata
from prism.graph.sim.load import rank_static_bytes
from prism.graph.sim.simulate import SimulationError
from prism.graph.sim.whatif import BlockDelay
from prism.graph.traces.memory import iteration_memory
from prism.replay.coordinator import Coordinator
from prism.replay.cores import CorePlan, launcher_on, plan_cores
from prism.schemas import graph_format as gf
from prism.schemas.files import write_json_atomic
from prism.schemas.iterations import (
    DEFAULT_WARMUP,
    MIN_PROGRAM_PROFILED,
    MIN_WARMUP,
    PROGRAM_PROFILED_WHY,
    clean_unprofiled,
)
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import GPT, PROGRAM, CaptureFiles, RankJob, RankResult
from prism.schemas.program import ProgramSpec
from prism.schemas.received_values import value_pass_rank
from prism.schemas.replay import (
    PhaseComparison,
    RankReport,
    ReplayFiles,
    ReplayIteration,
    ReplayJob,
    ReplayRankStats,
    ReplayReport,
    read_replay_stats,
)

Progress = Callable[[dict], None]


class ReplayInputError(ValueError):
    """Bad input to a replay: the message is one line."""


class ReplayDiverged(RuntimeError):
    """A replayed rank stopped: its program left the graph, or a wait could never end (one line)."""


@dataclass(frozen=True, kw_only=True)
class ReplayOptions:
    """What ``prism-replay`` runs."""

    graph: Path
    """graph.parquet built by prism-build-graph."""
    ranks: tuple[int, ...]
    """Global ranks to run for real."""
    out_dir: Path
    """Replay directory to create."""
    warmup: int = DEFAULT_WARMUP
    """Unprofiled iterations; the clean ones (all but the first and the last) give the steady time."""
    iterations: int = 2
    """Profiled iterations after them (Kineto trace, peak memory)."""
    device: str | None = None
    """cpu or cuda; None: the graph's."""
    threads: int = 1
    """torch intra-op threads of the real rank."""
    trace_peers: tuple[int, ...] = ()
    """Virtual ranks to write Chrome traces of."""
    delays: tuple[BlockDelay, ...] = ()
    """Straggler delays added to the real rank(s)' blocks (``prism.replay.straggler``)."""
    separately: bool = False
    """Run the ranks one after another, each alone against the graph, instead of all at once."""
    overwrite: bool = False
    """Replace a non-empty output directory."""
    timeout_s: float = 1800.0
    """Seconds before a rank process is killed."""
    program: tuple[str, ...] = ()
    """A program graph's program to run (``train.py ARGS`` or ``-m module ARGS``); empty: the one
    the graph was captured from, as it was started."""
    host_work: bool = True
    """On CPU, let each real rank's process do the host-side work of its virtual collectives
    where the graph's cluster spec measured it (``prism.peers.host_work``)."""
    pin: bool = False
    """On CPU, hold each real rank's process to cores of its own and the co-simulation to the
    rest, where the machine has a core to spare (``prism.replay.cores``); GPU ranks are not
    pinned (the driver's and NCCL's threads run beside the program's)."""


@dataclass(frozen=True, kw_only=True)
class ReplayTarget:
    """What the replayed ranks run, as the graph says."""

    job: RankJob
    """The rank job (the built-in GPT's config or the user's program), for every real rank."""
    static_bytes: dict[int, int]
    """Bytes each replayed rank holds across iterations, as the graph says (the measured peak's
    base on CPU where the run does not measure its own)."""
    received_values: dict[str, str]
    """A pipelined program's value-pass files per stage, base64 (``gf.RECEIVED_VALUES_KEY``)."""
    clock_from: int = 0
    """The first iteration run against the graph (a program's ``gf.STEADY_FROM_KEY``)."""

    @property
    def layout(self):
        return self.job.layout


def least_warmup(metadata: gf.GraphMetadata) -> int:
    """The fewest warm-up iterations a replay of the graph takes: a program's calls are the graph's
    from the iteration its capture found them steady, and its steady time needs clean iterations
    after that."""
    if gf.PROGRAM_KEY not in metadata.model:
        return MIN_WARMUP
    return max(MIN_WARMUP, int(metadata.extra.get(gf.STEADY_FROM_KEY, 1)) + 3)


def check_inputs(options: ReplayOptions) -> ReplayTarget:
    """What to replay, or a ReplayInputError saying what is wrong."""
    try:
        metadata = read_metadata(options.graph)
    except (GraphFormatError, ValueError, OSError) as e:
        message = str(e).splitlines()[0]
        named = message if message.startswith(str(options.graph)) else f"{options.graph}: {message}"
        raise ReplayInputError(named) from None
    if options.device not in (None, "cpu", "cuda"):
        raise ReplayInputError(f"--device {options.device!r}: prism replays on cpu or cuda")
    layout = ParallelLayout.from_dict(metadata.layout)
    if gf.PROGRAM_KEY in metadata.model:
        spec = ProgramSpec.from_dict(metadata.model[gf.PROGRAM_KEY])
        retargeted = [
            f"{metadata.build_options[key]} {key}"
            for key in ("layers", "microbatches")
            if metadata.build_options.get(key) is not None
        ]
        if gf.CAPTURED_LAYOUT_KEY in metadata.build_options:
            retargeted.append(str(layout).split(" (")[0])
        if retargeted and not options.program:
            at = " and ".join(retargeted)
            raise ReplayInputError(
                f"this graph runs {at}, built from a capture that differs: give your program at {at} "
                "(-- PROGRAM ARGS)"
            )
        if options.program:
            spec = replace(spec, argv=tuple(options.program), cwd=str(Path.cwd()))
        if options.device is not None:
            spec = replace(spec, device=options.device)
        job = RankJob(workload=PROGRAM, program=replace(spec, run_to_end=False), real_ranks=(),
                      warmup=options.warmup, iterations=options.iterations, threads=options.threads)  # fmt: skip
    else:
        if options.program:
            raise ReplayInputError(
                "this graph is of the built-in GPT: it runs its own program (give no -- PROGRAM)"
            )
        workload = metadata.build_options.get("workload", "gpt")
        if workload != "gpt":
            raise ReplayInputError(
                f"the graph's program is the {workload!r} workload; prism-replay runs 'gpt'"
            )
        config = dict(metadata.model)  # the built-in workload's record, read by the workload alone
        if options.device is not None:
            config["device"] = options.device
        job = RankJob(workload=GPT, config=config, real_ranks=(), warmup=options.warmup,
                      iterations=options.iterations, threads=options.threads)  # fmt: skip
    world = layout.world_size
    for rank in (*options.ranks, *options.trace_peers):
        if not 0 <= rank < world:
            raise ReplayInputError(f"rank {rank} is out of range: the graph's job has ranks 0..{world - 1}")
    if not options.ranks:
        raise ReplayInputError("name at least one --rank to run for real")
    if len(set(options.ranks)) != len(options.ranks):
        raise ReplayInputError("a --rank is named twice")
    if job.device == "cuda":
        gpus, together = _cuda_devices(), 1 if options.separately else len(options.ranks)
        if gpus == 0:
            raise ReplayInputError(
                "the program runs on cuda, but no CUDA device is available (use --device cpu)"
            )
        if together > gpus:
            raise ReplayInputError(
                f"{together} real ranks at once need a GPU each, and this machine has {gpus}: "
                "replay them one after another (--separately) or on a machine with more GPUs"
            )
    if options.warmup < MIN_WARMUP:
        raise ReplayInputError(
            f"--warmup must be at least {MIN_WARMUP}: the steady time needs clean iterations"
        )
    if options.iterations < 1:
        raise ReplayInputError(
            "--iterations must be at least 1 (the profiled ones give the trace and memory)"
        )
    if job.workload == PROGRAM and options.iterations < MIN_PROGRAM_PROFILED:
        raise ReplayInputError(f"{PROGRAM_PROFILED_WHY}, got {options.iterations}")
    if options.out_dir.exists() and any(options.out_dir.iterdir()) and not options.overwrite:
        raise ReplayInputError(f"{options.out_dir} is not empty (use --overwrite)")
    clock_from = int(metadata.extra.get(gf.STEADY_FROM_KEY, 1)) if job.workload == PROGRAM else 0
    if options.warmup < least_warmup(metadata):
        raise ReplayInputError(
            f"--warmup must be at least {least_warmup(metadata)}: the program's calls are the graph's from "
            f"iteration {clock_from} on, and the steady time needs clean iterations after it"
        )
    if options.host_work:  # the spec's host work of virtual collectives, done by every CPU rank
        job = replace(job, host_ns_per_byte=dict(metadata.cluster.get("host_ns_per_byte") or {}))
    try:
        static = rank_static_bytes(metadata, layout, list(options.ranks))
    except SimulationError as e:
        raise ReplayInputError(f"{options.graph}: {e}") from None
    return ReplayTarget(
        job=job,
        static_bytes=dict(zip(options.ranks, map(int, static), strict=True)),
        received_values=dict(metadata.extra.get(gf.RECEIVED_VALUES_KEY) or {}),
        clock_from=clock_from,
    )


def _cuda_devices() -> int:
    """GPUs this machine has (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_replay(
    options: ReplayOptions, on_event: Progress | None = None, hooks: CaptureHooks | None = None
) -> ReplayReport:
    """Replay every rank of ``options``; write the replay directory and return its report.

    ``hooks`` are told before and after each rank's run (``batch_starting`` / ``batch_done``),
    as a capture tells them of its batches."""
    target = check_inputs(options)
    options.out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{options.out_dir.name}.", dir=options.out_dir.parent))
    try:
        files = ReplayFiles(tmp)
        _write_received_values(target, CaptureFiles(tmp))
        hooks = hooks or CaptureHooks()
        alone = options.separately or len(options.ranks) == 1
        cores = _core_plan(options, target, 1 if alone else len(options.ranks))
        for batch in [(rank,) for rank in options.ranks] if alone else [options.ranks]:
            # The coordinator's thread starts inside: it takes the launcher's cores.
            with (
                launcher_on(cores.launcher if cores else None),
                Coordinator(options.graph, batch, trace_ranks=options.trace_peers) as coordinator,
            ):
                job = replace(
                    _job(options, target, real_ranks=() if alone else batch), coordinator=coordinator.address
                )
                write_json_atomic(files.job, job.to_dict())
                _run_batch(files, batch, options, target, on_event, hooks, coordinator, cores)
        reports = [rank_report(files, rank, target, warmup=options.warmup) for rank in options.ranks]
        report = ReplayReport(
            graph=str(options.graph), layout=str(target.layout), device=target.job.device,
            warmup=options.warmup, iterations=options.iterations, ranks=tuple(reports),
            cores=cores.to_dict() if cores else None,
        )  # fmt: skip
        write_json_atomic(files.report, report.to_dict())
        if options.out_dir.exists():
            shutil.rmtree(options.out_dir)
        tmp.rename(options.out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _core_plan(options: ReplayOptions, target: ReplayTarget, ranks_at_once: int) -> CorePlan | None:
    if not options.pin or target.job.device == "cuda":
        return None
    return plan_cores(ranks_at_once, options.threads)


def _job(options: ReplayOptions, target: ReplayTarget, *, real_ranks: tuple[int, ...]) -> ReplayJob:
    return ReplayJob(
        program=replace(target.job, real_ranks=real_ranks), graph=str(options.graph.resolve()),
        trace_peers=options.trace_peers, delays=tuple(asdict(d) for d in options.delays),
        clock_from=target.clock_from,
    )  # fmt: skip


def _write_received_values(target: ReplayTarget, files: CaptureFiles) -> None:
    """A pipelined program's value-pass files, where its rank processes look for them."""
    for stage, encoded in target.received_values.items():
        path = files.values(value_pass_rank(target.layout, int(stage)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(encoded))


def _run_batch(
    files: ReplayFiles, ranks: tuple[int, ...], options: ReplayOptions, target: ReplayTarget,
    on_event: Progress | None, hooks: CaptureHooks, coordinator: Coordinator, cores: CorePlan | None,
) -> None:  # fmt: skip
    """Run the processes of ``ranks`` at once, served by ``coordinator``."""
    errors: list[str] = []

    def events(event: dict) -> None:
        if event.get("event") == "error":
            errors.append(event["message"])
        if on_event is not None:
            on_event(event)

    launches = [
        RankLaunch(
            rank=rank,
            local_rank=i,
            cpus=cores.ranks[i] if cores else None,
            log_path=files.log(rank),
            argv=(
                sys.executable,
                "-m",
                "prism.replay.rank_main",
                "--job",
                str(files.job),
                "--rank",
                str(rank),
                "--out",
                str(files.root),
            ),
        )  # fmt: skip
        for i, rank in enumerate(ranks)
    ]
    # ``capture_dir``: where a pipelined program's received values are, for ranks run beside it.
    hooks.batch_starting(ranks, {rank: target.layout.role(rank) for rank in ranks}, capture_dir=files.root)
    try:
        run_processes(launches, world_size=target.layout.world_size, timeout_s=options.timeout_s, on_event=events,
                      env={"OMP_NUM_THREADS": str(options.threads)})  # fmt: skip
    except LaunchError as e:
        first = coordinator.error or (errors[0] if errors else None)
        if first:
            raise ReplayDiverged(first) from None
        raise ReplayDiverged(str(e)) from None  # with the failing rank's last log lines
    finally:
        hooks.batch_done(ranks)


def _pct(pred: float, real: float) -> float:
    return (pred - real) / real * 100 if real else float("nan")


def rank_report(files: ReplayFiles, rank: int, target: ReplayTarget, *, warmup: int) -> RankReport:
    """Measured vs predicted for one replayed rank, from the files its process wrote."""
    result = RankResult.from_dict(json.loads(files.result(rank).read_text()))
    stats = read_replay_stats(files.replay_stats(rank))
    # The clean unprofiled iterations, the window the build's profiler correction predicts; the
    # emulated time is the program's wall time with the engine's stalls taken out. A program's
    # set-up iterations ran against no graph, and its first co-simulated one is the
    # co-simulation's cold start (as iteration 0 is for the built-in workload's).
    skip = stats.simulated_from
    clean = clean_unprofiled(stats.iterations, warmup)[skip:]
    measured = statistics.median(it.emulated_ns for it in clean)
    wall = statistics.median(clean_unprofiled(result.iteration_ns, warmup)[skip:])
    layout = target.layout
    stage = layout.stage(rank)
    # A program's graph takes memory from the profiled iterations after the first (the profiler
    # sees no free of a block allocated before it started): measure the same iterations.
    program = target.job.workload == PROGRAM
    memory = iteration_memory(files.kineto(rank), after_first=program) if target.job.device == "cpu" else None
    static = result.static_bytes if result.static_bytes is not None else target.static_bytes[rank]
    measured_peak = static + memory.peak_delta_bytes if memory is not None else result.peak_device_bytes
    phases = _phases(stats, clean)
    return RankReport(
        rank=rank,
        stage=stage,
        role=layout.role_of_stage(stage).value,
        measured_iter_ms=measured / 1e6,
        predicted_iter_ms=stats.predicted_iteration_ns / 1e6,
        iter_err_pct=_pct(stats.predicted_iteration_ns, measured),
        measured_peak_bytes=measured_peak,
        predicted_peak_bytes=stats.predicted_peak_bytes,
        mem_err_pct=None if measured_peak is None else _pct(stats.predicted_peak_bytes, measured_peak),
        engine_ms_per_iter=statistics.median(it.engine_ns for it in clean) / 1e6,
        stall_ms_per_iter=statistics.median(it.stall_ns for it in clean) / 1e6,
        calls_per_iter=stats.iterations[-1].calls,
        replay_rss_bytes=stats.replay_rss_bytes,
        phases=phases,
        wall_iter_ms=wall / 1e6,
        wall_err_pct=_pct(stats.predicted_iteration_ns, wall),
    )


def _phases(stats: ReplayRankStats, clean: tuple[ReplayIteration, ...]) -> tuple[PhaseComparison, ...]:
    names = sorted(set(stats.predicted_phase_ns) | {p for it in clean for p in it.phase_ns})
    return tuple(
        PhaseComparison(
            phase=name or "(none)",
            measured_ms=statistics.median(it.phase_ns.get(name, 0) for it in clean) / 1e6,
            predicted_ms=stats.predicted_phase_ns.get(name, 0) / 1e6,
        )
        for name in names
    )
