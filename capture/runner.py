"""Run a capture: plan which ranks are real, run them, and assemble the capture directory.

Everything is written into a temporary directory beside the output and renamed into place at
the end, so a failed capture leaves nothing half-written behind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import platform
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from prism.capture.launch import LaunchError, RankLaunch, rank_command, run_processes
from prism.capture.preflight import (
    CaptureError,
    check_device,
    check_full_run_fits,
    check_output,
    check_program,
    check_rank_fits,
    check_ranks,
)
from prism.capture.value_pass import needs_value_pass, value_pass_ranks
from prism.capture.workloads.gpt.config import GPTConfig
from prism.peers.host_staged import SHARED_GPU_ENV
from prism.schemas import PRISM_VERSION
from prism.schemas.cluster import ClusterSpec
from prism.schemas.comm_log import read_comm_log
from prism.schemas.files import write_json_atomic
from prism.schemas.iterations import (
    CUT_HINT,
    DEFAULT_WARMUP,
    MIN_PROGRAM_PROFILED,
    PROGRAM_PROFILED_WHY,
    implausible_iterations,
)
from prism.schemas.layout import ParallelLayout, Role
from prism.schemas.layout_match import axes_called, unused_axis
from prism.schemas.manifest import (
    GPT,
    PROGRAM,
    CapturedRank,
    CaptureFiles,
    CaptureManifest,
    RankJob,
    RankResult,
    write_manifest,
)
from prism.schemas.program import ProgramSpec


class RealMode(enum.StrEnum):
    """Which ranks run for real during the capture."""

    ROLES = "roles"  # one real process per role, one after another; all peers virtual
    ALL = "all"  # every rank of the layout at once (ground truth for small layouts)


class ProgramRoles(enum.StrEnum):
    """Which pipeline positions of a program are captured (each alone, tp and dp index 0)."""

    PIPELINE = "pipeline"  # every stage
    FIRST_MIDDLE_LAST = "first-middle-last"  # stage 0, two middle stages, the last; middles stand for all
    AXIS_ENDS = "axis-ends"  # every stage, and on each the ranks at index 1 and last of every other axis


def program_stages(layout: ParallelLayout, roles: ProgramRoles) -> tuple[int, ...]:
    """The stages captured for ``roles``: with first-middle-last, 0, 1, pp-2 and pp-1."""
    if roles == ProgramRoles.FIRST_MIDDLE_LAST:
        return tuple(sorted({0, min(1, layout.pp - 1), max(layout.pp - 2, 0), layout.pp - 1}))
    return tuple(range(layout.pp))


def program_ranks(layout: ParallelLayout, roles: ProgramRoles) -> tuple[int, ...]:
    """The ranks captured for ``roles``: each captured stage's first rank and, with axis-ends,
    its ranks at index 1 and at the last index of every other axis of the mesh
    (``ParallelLayout.axis_seconds``, ``axis_ends``)."""
    ranks: dict[int, None] = {}  # ordered, each once (dp_shard's end can be edp's)
    for stage in program_stages(layout, roles):
        ranks[layout.rank(tp=0, dp=0, pp=stage)] = None
        if roles == ProgramRoles.AXIS_ENDS:
            ranks |= dict.fromkeys((*layout.axis_seconds(stage).values(), *layout.axis_ends(stage).values()))
    return tuple(ranks)


@dataclass(frozen=True, kw_only=True)
class CaptureOptions:
    """A capture to run."""

    config: GPTConfig | None = None
    """The built-in GPT's model and target layout; None when ``program`` is given."""
    program: ProgramSpec | None = None
    """The user's program and its target layout, instead of the built-in GPT."""
    ranks: tuple[int, ...] | None = None
    """Ranks to capture, each alone with every peer virtual (``--ranks``); None: one per role."""
    out_dir: Path
    """Capture directory to create."""
    real: RealMode = RealMode.ROLES
    """Which ranks run for real."""
    roles: ProgramRoles = ProgramRoles.PIPELINE
    """A program's captured pipeline positions (without ``ranks``)."""
    warmup: int = DEFAULT_WARMUP
    """Iterations before profiling."""
    iterations: int = 2
    """Iterations profiled."""
    threads: int = 1
    """torch intra-op threads per rank process."""
    host_ns_per_byte: Mapping[str, float] = field(default_factory=dict, hash=False)
    """CPU ranks: the host-side work of virtual collectives, per byte by op class, that each rank
    does beside its program as gloo would (``RankJob.host_ns_per_byte``); empty: none."""
    hold_calls: ClusterSpec | None = None
    """CPU ranks: a spec of this machine under whose price each virtual call holds the program, as
    the real call's wait would (``RankJob.hold_calls``); None: virtual calls complete at once."""
    overwrite: bool = False
    """Replace a non-empty output directory."""
    rank_timeout_s: float = 1800.0
    """A batch of rank processes still running after this long is killed."""

    @property
    def layout(self) -> ParallelLayout:
        return self.program.layout if self.program is not None else self.config.layout

    @property
    def device(self) -> str:
        return self.program.device if self.program is not None else self.config.device


@dataclass(frozen=True, kw_only=True)
class RankBatch:
    """Ranks started together; batches run one after another."""

    ranks: tuple[int, ...]
    """Global ranks of the batch."""
    value_pass: bool = False
    """The ranks run together, unprofiled, to record the values they send each other
    (``prism.capture.value_pass``); they are captured afterwards, each alone."""


class CaptureHooks:
    """Callbacks the console front end uses to show progress; the defaults do nothing."""

    def batch_starting(
        self,
        ranks: tuple[int, ...],
        roles: dict[int, Role],
        *,
        value_pass: bool = False,
        capture_dir: Path | None = None,
    ) -> Callable[[dict], None] | None:
        """Called before a batch starts (``capture_dir``: the capture being written); may return a
        callback for its progress events."""
        return None

    def batch_done(self, ranks: tuple[int, ...]) -> None:
        """Called after a batch finished."""


def plan_batches(options: CaptureOptions) -> list[RankBatch]:
    """The batches of real ranks to run, in order."""
    layout = options.layout
    if options.real == RealMode.ALL:
        return [RankBatch(ranks=tuple(range(layout.world_size)))]
    # Each captured rank runs alone with all its peers virtual: one device is enough.
    if options.ranks is not None:
        ranks = options.ranks
    elif options.program is not None:
        # A program prism knows nothing about: one rank per pipeline position (or per kind).
        ranks = program_ranks(layout, options.roles)
    else:
        ranks = tuple(layout.roles().values())
    alone = [RankBatch(ranks=(rank,)) for rank in ranks]
    if options.program is not None and needs_value_pass(layout):
        return [RankBatch(ranks=value_pass_ranks(layout), value_pass=True), *alone]
    return alone


def check_options(options: CaptureOptions) -> None:
    if options.iterations < 1:
        raise CaptureError(f"--iterations must be at least 1, got {options.iterations}")
    if options.program is not None and options.iterations < MIN_PROGRAM_PROFILED:
        raise CaptureError(f"{PROGRAM_PROFILED_WHY}, got {options.iterations}")
    if options.warmup < 0:
        raise CaptureError(f"--warmup must be 0 or more, got {options.warmup}")
    if options.threads < 1:
        raise CaptureError(f"--threads must be at least 1, got {options.threads}")
    if (options.config is None) == (options.program is None):
        raise CaptureError("a capture runs either the built-in GPT or a program, not both")
    if options.config is not None and options.roles != ProgramRoles.PIPELINE:
        raise CaptureError("--roles is for programs: the built-in GPT's roles are known")
    check_device(options.device)
    if options.program is not None:
        check_program(options.program)
    if options.ranks is not None:
        check_ranks(options.ranks, options.layout)
    if options.real == RealMode.ALL:
        check_full_run_fits(options.layout, options.device, options.config)
    elif options.config is not None:
        check_rank_fits(options.config, options.device)
    check_output(options.out_dir, overwrite=options.overwrite)


def _job(options: CaptureOptions) -> RankJob:
    # Roles run alone (empty tuple: only the rank itself is real); --real all runs every rank.
    return RankJob(
        workload=GPT if options.program is None else PROGRAM,
        config=None if options.config is None else options.config.to_dict(),
        program=options.program,
        real_ranks=None if options.real == RealMode.ALL else (),
        warmup=options.warmup,
        iterations=options.iterations,
        threads=options.threads,
        host_ns_per_byte=dict(options.host_ns_per_byte),
        hold_calls=options.hold_calls,
    )


def _run_batch(options: CaptureOptions, tmp: Path, batch: RankBatch, hooks: CaptureHooks) -> None:
    files = CaptureFiles(tmp)
    layout = options.layout
    main = "prism.capture.rank_main" if options.program is None else "prism.capture.program_main"
    job = files.values_job if batch.value_pass else files.job
    log = (lambda r: files.values(r).with_suffix(".log")) if batch.value_pass else files.log
    devices = local_devices(options.device)
    launches = [
        RankLaunch(
            rank=r,
            argv=rank_command(job, r, tmp, main),
            log_path=log(r),
            local_rank=i % devices if devices else i,
        )
        for i, r in enumerate(batch.ranks)
    ]
    on_event = hooks.batch_starting(
        batch.ranks, {r: layout.role(r) for r in batch.ranks}, value_pass=batch.value_pass, capture_dir=tmp
    )
    # Rank processes pin their own thread count; keep OpenMP from oversubscribing before that.
    env = {"OMP_NUM_THREADS": str(options.threads)}
    if devices is not None and len(batch.ranks) > devices:
        env[SHARED_GPU_ENV] = "1"
    try:
        run_processes(
            launches,
            world_size=layout.world_size,
            timeout_s=options.rank_timeout_s,
            on_event=on_event,
            env=env,
        )
    except LaunchError as e:
        raise CaptureError(str(e)) from e
    hooks.batch_done(batch.ranks)


def captured_rank(tmp: Path, rank: int, layout: ParallelLayout) -> CapturedRank:
    """The manifest entry of ``rank``, whose process wrote its files under ``tmp``."""
    files = CaptureFiles(tmp)
    missing = [p.relative_to(tmp) for p in files.rank_files(rank) if not p.is_file()]
    if missing:
        raise CaptureError(f"rank {rank} exited cleanly but did not write {', '.join(map(str, missing))}")
    return CapturedRank(
        rank=rank,
        role=layout.role(rank),
        stage=layout.stage(rank),
        kineto=str(files.kineto(rank).relative_to(tmp)),
        et=str(files.et(rank).relative_to(tmp)),
        comm=str(files.comm(rank).relative_to(tmp)),
        result=RankResult.from_dict(json.loads(files.result(rank).read_text())),
    )


def check_iterations(ranks: tuple[CapturedRank, ...], warmup: int) -> None:
    """Refuse a capture whose iterations are not its program's training steps (one line)."""
    for captured in ranks:
        result = captured.result
        reason = implausible_iterations(result.iteration_ns, warmup, result.calls)
        if reason is not None:
            raise CaptureError(f"rank {captured.rank}'s {reason}; {CUT_HINT}")


def check_axes_called(capture_dir: Path, ranks: tuple[CapturedRank, ...], layout: ParallelLayout) -> None:
    """Refuse a program's capture at a layout with an axis no captured rank made a call across
    (``--pp 16`` given to a program without a pipeline): one line."""
    used: set[str] = set()
    for captured in ranks:
        calls = read_comm_log(CaptureFiles(capture_dir).comm(captured.rank)).calls
        used |= axes_called(layout, captured.rank, [(c.op, c.label, c.peer) for c in calls])
    reason = unused_axis(layout, used)
    if reason is not None:
        raise CaptureError(reason)


def local_devices(device: str) -> int | None:
    """The GPUs a batch's ranks spread over (ranks run together, a pipeline's stages in the value
    pass, share them where there are fewer GPUs than ranks); None on CPU: one LOCAL_RANK a rank."""
    return max(torch.cuda.device_count(), 1) if device == "cuda" else None


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def machine_notes() -> dict:
    """What a manifest's notes say of the machine."""
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()}


def run_capture(options: CaptureOptions, hooks: CaptureHooks | None = None) -> CaptureManifest:
    """Run the capture described by ``options`` and return its manifest."""
    hooks = hooks or CaptureHooks()
    check_options(options)
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    out_dir = options.out_dir
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.resolve().parent))
    try:
        job = _job(options)
        write_json_atomic(CaptureFiles(tmp).job, job.to_dict())
        batches = plan_batches(options)
        for batch in batches:
            if batch.value_pass:
                values_job = dataclasses.replace(job, real_ranks=batch.ranks, value_pass=True)
                write_json_atomic(CaptureFiles(tmp).values_job, values_job.to_dict())
            _run_batch(options, tmp, batch, hooks)
        captured = [b for b in batches if not b.value_pass]
        ranks = tuple(captured_rank(tmp, r, options.layout) for b in captured for r in b.ranks)
        check_iterations(ranks, job.warmup)
        if options.program is not None:
            check_axes_called(tmp, ranks, options.layout)
        manifest = CaptureManifest(
            layout=options.layout,
            mode=options.real.value,
            job=job,
            ranks=ranks,
            rerun_command=rerun_command_template(),
            torch_version=torch.__version__,
            device=device_name(options.device),
            host=socket.gethostname(),
            started_at=started_at,
            wall_s=round(time.perf_counter() - t0, 3),
            prism_version=PRISM_VERSION,
            notes=machine_notes(),
        )
        write_manifest(manifest, tmp)
        _move_into_place(tmp, out_dir)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def rerun_command_template() -> tuple[str, ...]:
    """argv that re-runs one rank of a capture; replay fills in the placeholders.

    For a roles capture the command runs alone; for a ``--real all`` capture every rank of the
    world must be started together, with MASTER_ADDR, MASTER_PORT and LOCAL_RANK in the
    environment, as under torchrun.
    """
    return rank_command(Path("{capture_dir}") / "job.json", "{rank}", Path("{out_dir}"))


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    if out_dir.exists():
        # Only reached with overwrite (checked up front): swap, then delete the old one.
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out_dir)
