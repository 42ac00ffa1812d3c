"""Build graph.parquet from a capture: normalize, template, compose per stage, bind ranks, validate."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import psutil

from prism.graph.build import op_table as T
from prism.graph.build.bind import bind_ranks, encode_program
from prism.graph.build.compose import GradBuckets, compose_stage
from prism.graph.build.normalize import normalize_rank
from prism.graph.build.profiler_overhead import (
    Correction,
    calls_are_launches,
    correction_scale,
    own_ns,
    scale_template,
)
from prism.graph.build.program_graph import program_stages
from prism.graph.build.resized_groups import target_layout
from prism.graph.build.retarget import StageHolding, holding, stage_parameters
from prism.graph.build.templates import (
    GRAD_SYNC,
    OPTIM,
    POST,
    PRE,
    RoleTemplate,
    TemplateError,
    build_role_template,
)
from prism.graph.build.timing_checks import UntrustedTiming, check_timing
from prism.graph.comm.placement import LayoutTables
from prism.graph.io.parquet import RANKS_PER_ROW_GROUP, GraphWriter
from prism.graph.io.parts import remove_graph
from prism.graph.io.validate import RowGroupValidator, ValidationReport
from prism.graph.sim.noise import call_jitter_ns, iteration_cv
from prism.peers.comm_model import CommModel
from prism.schemas import PRISM_VERSION
from prism.schemas import graph_format as gf
from prism.schemas.annotations import GLUE
from prism.schemas.cluster import ClusterSpec
from prism.schemas.comm_log import HeldTime, read_comm_log
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.held_parameters import HeldParameters
from prism.schemas.layout import ParallelLayout, Role
from prism.schemas.layout_options import DEGREES, flag
from prism.schemas.manifest import PACED_MODE, CaptureFiles, CaptureManifest, ManifestError, read_manifest
from prism.schemas.pipeline_shape import PipelineShape, ShapeError
from prism.schemas.rank_programs import program_of, rank_variants, ranks_per_program
from prism.schemas.workload import reshaped

ProgressCallback = Callable[[int, int], None]
"""Called with (ranks written, total ranks)."""


class BuildError(ValueError):
    """A graph that cannot be built from this capture; the message is one line for the user."""


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """What graph to build from which capture."""

    capture_dir: Path
    """Capture directory written by prism-capture."""
    out: Path
    """graph.parquet to write."""
    cluster: ClusterSpec
    """Cluster the comm durations are computed for."""
    microbatches: int | None = None
    """Microbatches per iteration; None keeps the capture's."""
    layers: int | None = None
    """Transformer layers of the model; None keeps the capture's."""
    ranks_per_row_group: int | None = None
    """Consecutive ranks per Parquet row group; None: ``RANKS_PER_ROW_GROUP``."""
    profiler_correction: Correction = Correction.PHASE
    """How compute and gaps are scaled to the captured ranks' unprofiled iterations (``profiler_overhead``)."""
    simulated_after: bool = False
    """The caller simulates the graph once built (``prism-build-graph``'s summary): the up-front
    room check counts the simulation's memory (the larger) instead of the build's."""
    tp: int | None = None
    """Target tensor-parallel degree (the capture's: None or equal)."""
    pp: int | None = None
    """Target pipeline-parallel degree; None keeps the capture's."""
    dp: int | None = None
    """Target data-parallel degree; None keeps the capture's."""
    dp_replicate: int | None = None
    """Target HSDP replicas; None keeps the capture's."""
    dp_shard: int | None = None
    """Target sharding data-parallel degree; None keeps the capture's."""
    cp: int | None = None
    """Target context-parallel degree (a program's: None or the capture's)."""
    ep: int | None = None
    """Target expert-parallel degree (a program's: None or the capture's)."""
    etp: int | None = None
    """Target expert tensor-parallel degree (a program's: None or the capture's)."""

    def degrees(self) -> dict[str, int | None]:
        """The layout's degrees given (None: the capture's)."""
        return {name: getattr(self, name) for name in DEGREES}


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    """What was built."""

    metadata: GraphMetadata
    """File metadata written."""
    report: ValidationReport
    """The validator's verdict and counts."""
    warnings: tuple[str, ...] = ()
    """What the user should know about the graph's prices (one line each)."""

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout.from_dict(self.metadata.layout)

    @property
    def time_scales(self) -> dict | None:
        """Profiler correction applied, per captured rank; None if none was."""
        return self.metadata.extra.get(gf.TIME_SCALE_KEY)


def target_shape(record: dict, options: BuildOptions) -> PipelineShape:
    """The shape of the built-in workload's graph: its captured record's, with the options'."""
    captured = PipelineShape.of_record(record)
    if options.tp is not None and options.tp != captured.tp:
        raise BuildError(
            f"--tp {options.tp} differs from the capture's tp={captured.tp}: per-rank shapes depend on tp, "
            f"re-capture with --tp {options.tp}"
        )
    extra = [flag(n) for n in DEGREES if n not in ("tp", "pp", "dp") and getattr(options, n) not in (None, 1)]
    if extra:
        raise BuildError(f"the built-in GPT has tp, pp and dp only; {', '.join(extra)} are for programs")
    given = {k: getattr(options, k) for k in ("pp", "dp", "microbatches", "layers")}
    try:
        return replace(captured, **{k: v for k, v in given.items() if v is not None})
    except ShapeError as e:
        raise BuildError(f"target is inconsistent with the model: {e}") from e


def load_templates(
    capture_dir: Path,
    manifest: CaptureManifest,
    roles: set[Role],
    *,
    profiler_correction: Correction = Correction.PHASE,
) -> tuple[dict[Role, RoleTemplate], dict[str, dict] | None]:
    """Templates of the captured ranks standing for ``roles``, and the time scale applied to each.

    Unless ``profiler_correction`` is NONE, every template is scaled to its rank's unprofiled
    iterations when the capture has clean ones (warm-up >= 3) and left as measured (None) when
    not; by phase on CPU captures that timed their phases (``profiler_overhead``).
    """
    correct = profiler_correction != Correction.NONE
    captured = PipelineShape.of_record(manifest.job.config)
    templates, scales = {}, {}
    for role in sorted(roles):
        rank = manifest.rank_of_role(role)
        if rank is None:
            have = ", ".join(sorted(r.role.value for r in manifest.ranks))
            raise BuildError(
                f"the target needs a '{role.value}' pipeline stage but the capture (pp={captured.pp}) only has "
                f"{have}; capture with a pp that has that stage"
            )
        ops = normalize_rank(capture_dir, rank.rank)
        first = captured.stage_layers(rank.stage).start
        template = build_role_template(ops, rank=rank.rank, stage=rank.stage, first_layer=first)
        # A paced capture's iterations include its emulated waits: only the program's own time counts.
        scale = correction_scale(rank.result, manifest.job.warmup, profiler_correction, manifest.job.device)
        cv = iteration_cv(rank.result.own_iteration_ns, manifest.job.warmup)
        jitter = _call_jitter_ns(capture_dir, rank.rank, ops, manifest)
        template = replace(template, noise_cv=cv, call_jitter_ns=jitter)
        if scale is not None:
            scale = scale.fitted(*_once_an_iteration(template))
        # Launches and posts are kept, corrected or not.
        template = scale_template(template, scale, launches=calls_are_launches(manifest.job.device))
        if scale is not None:
            scales[role.value] = scale.to_dict() | {"noise_cv": round(cv, 6), "call_jitter_ns": round(jitter)}
        templates[role] = template
    return templates, (scales if correct and len(scales) == len(templates) else None)


def _once_an_iteration(template: RoleTemplate) -> tuple[dict[str, float], dict[str, tuple[str, ...]]]:
    """The own time the template holds of the phases an iteration runs once, as the phase timer
    names them (glue: the pre and post segments; the optimizer step), and what the step absorbs:
    a gradient sync's time where the sync has no op (no data parallelism), which sits in the gap
    before the step's first op. ``TimeScale.fitted``'s arguments."""
    held = {GLUE: sum(own_ns(template.segments[k].units) for k in (PRE, POST) if k in template.segments)}
    if OPTIM not in template.segments:
        return held, {}
    held[OPTIM] = own_ns(template.segments[OPTIM].units)
    return held, ({} if GRAD_SYNC in template.segments else {OPTIM: (GRAD_SYNC,)})


def _call_jitter_ns(capture_dir: Path, rank: int, ops, manifest: CaptureManifest) -> float:
    """The captured rank's per-call noise floor (``prism.graph.sim.noise.call_jitter_ns``); 0 when its
    profiled iterations do not all make the same number of calls."""
    per_iteration = ops[ops[T.IS_COMM]].groupby(T.ITERATION).size().unique()
    if len(per_iteration) != 1:
        return 0.0
    log = read_comm_log(CaptureFiles(capture_dir).comm(rank))
    held = HeldTime(log)  # a paced capture: time between calls less its emulated waits

    def own_clock(wall_ns: int) -> int:
        return wall_ns - held.until(wall_ns)

    return call_jitter_ns(
        np.array([own_clock(c.enter_ns) for c in log.calls]), np.array([own_clock(c.exit_ns) for c in log.calls]),
        int(per_iteration[0]), manifest.job.warmup + manifest.job.iterations, manifest.job.warmup,
    )  # fmt: skip


def _digest(capture_dir: Path) -> str:
    return hashlib.sha256(CaptureFiles(capture_dir).manifest.read_bytes()).hexdigest()


def build_graph(options: BuildOptions, progress: ProgressCallback | None = None) -> BuildResult:
    """Build and validate ``options.out``; nothing is left behind on failure."""
    try:
        manifest = read_manifest(options.capture_dir)
        check_timing(manifest, options.profiler_correction)
    except (ManifestError, UntrustedTiming) as e:
        raise BuildError(str(e)) from e
    if manifest.job.program is not None:
        return _build_program_graph(options, manifest, progress)
    try:
        shape, captured = (
            target_shape(manifest.job.config, options),
            PipelineShape.of_record(manifest.job.config),
        )
    except ShapeError as e:
        raise BuildError(f"the capture's workload record: {e}") from e
    layout = shape.layout
    try:
        templates, scales = load_templates(
            options.capture_dir,
            manifest,
            {layout.role_of_stage(s) for s in range(shape.pp)},
            profiler_correction=options.profiler_correction,
        )
        holdings, captured_holdings = stage_holdings(manifest, shape)
        stages = []
        for s, held in enumerate(holdings):
            role = layout.role_of_stage(s)
            buckets = GradBuckets(
                target=held.buckets,
                captured=captured_holdings[role].buckets,
                itemsize=held.parameters.itemsize,
            )
            stages.append(
                encode_program(
                    compose_stage(templates[role], shape=shape, captured=captured, stage=s, buckets=buckets),
                    layout,
                )
            )
    except TemplateError as e:
        raise BuildError(str(e)) from e
    metadata = GraphMetadata(
        layout=layout.to_dict(),
        model=reshaped(manifest.job.config, pp=shape.pp, dp=shape.dp, microbatches=shape.microbatches, layers=shape.layers),
        cluster=_priced_cluster(options.cluster, manifest),
        capture_digest=_digest(options.capture_dir),
        build_options={"microbatches": shape.microbatches, "layers": shape.layers, "ranks_per_row_group": _row_group_ranks(options)},
        prism_version=PRISM_VERSION,
        extra={gf.TIME_SCALE_KEY: scales, gf.STATIC_BYTES_KEY: [h.static_bytes for h in holdings]},
    )  # fmt: skip
    metadata, report = _checked_write(options, metadata, stages, layout, progress)
    return BuildResult(metadata=metadata, report=report)


def _priced_cluster(spec: ClusterSpec, manifest: CaptureManifest) -> dict:
    """The spec the graph is simulated with. A paced capture's compute already ran after its
    waits: its graph must not pay their wake cost again."""
    if manifest.mode == PACED_MODE:
        spec = replace(spec, wake_compute={})
    return spec.to_dict()


def stage_holdings(
    manifest: CaptureManifest, shape: PipelineShape
) -> tuple[list[StageHolding], dict[Role, StageHolding]]:
    """What every rank of each target stage holds (``retarget``), and what the captured rank of
    each role held, from the parameters the capture recorded; on CUDA with what the captured
    rank's device held beyond them (CUDA libraries' buffers, cuBLAS workspaces, kept in the same
    allocator)."""
    layout, captured = shape.layout, manifest.job.layout
    recorded: dict[Role, tuple[HeldParameters, int]] = {}
    held: dict[Role, StageHolding] = {}
    for role in {layout.role_of_stage(s) for s in range(shape.pp)}:
        rank = manifest.rank_of_role(role)
        if rank.result.parameters is None:
            raise BuildError(
                f"rank {rank.rank}'s result has no parameters (a capture by an earlier prism): re-capture it with this prism"
            )
        held[role] = holding(rank.result.parameters, data_parallel=captured.dp > 1)
        measured = rank.result.static_bytes
        recorded[role] = (
            rank.result.parameters,
            0 if measured is None else measured - held[role].static_bytes,
        )
    stages = []
    for s in range(shape.pp):
        parameters, beyond = recorded[layout.role_of_stage(s)]
        target = stage_parameters(parameters, shape.stage_layers(s))  # build_graph names a TemplateError
        stages.append(holding(target, data_parallel=shape.dp > 1, beyond_bytes=beyond))
    return stages, held


def _build_program_graph(options: BuildOptions, manifest: CaptureManifest, progress) -> BuildResult:
    try:
        layout = target_layout(options.degrees(), manifest.job.program.layout)
        built = program_stages(
            options.capture_dir, manifest, cluster=options.cluster.to_dict(), digest=_digest(options.capture_dir),
            options={"ranks_per_row_group": _row_group_ranks(options)}, correction=options.profiler_correction,
            layers=options.layers, microbatches=options.microbatches, target=layout,
        )  # fmt: skip
    except TemplateError as e:
        raise BuildError(str(e)) from e
    metadata, report = _checked_write(options, built.metadata, built.stages, layout, progress)
    return BuildResult(metadata=metadata, report=report, warnings=built.notes)


def _checked_write(
    options: BuildOptions, metadata: GraphMetadata, stages: list, layout: ParallelLayout, progress
) -> tuple[GraphMetadata, ValidationReport]:
    """Check the room, record the replicas, write and validate: the metadata written, the verdict.

    Two dp replicas repeat each other exactly where their ranks run the same programs (every
    replica does, unless a rank variant lies along the fold axis) and the cluster prices their
    calls alike (``LayoutTables.replica_of``); a simulation reads each distinct one once."""
    variants = rank_variants(metadata)
    nodes = _nodes(stages, ranks_per_program(layout, variants))
    check_room(options.out, nodes)  # before any per-rank table: a world too large stops here
    program = program_of(layout, variants, np.arange(layout.world_size))
    tables = LayoutTables.build(layout, options.cluster.gpus_per_node)
    replica_of = tables.replica_of(program)
    if options.simulated_after:  # the simulation reads the distinct replicas
        check_room(options.out, nodes, simulated_nodes=nodes * len(np.unique(replica_of)) // len(replica_of))
    metadata = replace(metadata, extra={**metadata.extra, gf.REPLICA_OF_KEY: replica_of.tolist()})
    return metadata, _write(options, metadata, stages, tables, program, progress)


BUILD_BYTES_PER_NODE = 1
"""Peak memory per node of the graph while it is written and validated, with room: the rows are
bound, written and checked one row group at a time, so only the row groups (larger past 32,768
ranks) and the per-rank tables grow: 0.55 GiB at 1,024 ranks (2.9 M nodes), 0.83 GiB at 131,072
ranks (373 M nodes) with ``--no-simulate`` (``benchmarks/results/scale.txt``)."""
SIMULATE_BYTES_PER_NODE = 150
"""Peak memory per node the simulation holds in the engine's arrays (those of the distinct
replicas it reads), with room: 2.12 GiB for the 23.3 M nodes of 8,192 ranks loaded whole
(``benchmarks/results/simulate_speed.txt``)."""
FILE_BYTES_PER_NODE = 2
"""Bytes on disk per node, with room: 1.36 at 8,192 ranks, 1.22 at 131,072 (identical ranks compress)."""
MEMORY_BASE_BYTES = 1 << 30
"""What a build holds besides the graph (Python, torch, pyarrow, the templates), with room."""


BIND_RANKS = 256
"""Ranks bound in one batch (the writer cuts them into row groups): binding costs about 1 ms a
call beside its rows, which batches of one 32-rank row group paid 8 times as often."""


def _row_group_ranks(options: BuildOptions) -> int:
    given = options.ranks_per_row_group
    return RANKS_PER_ROW_GROUP if given is None else given


def _nodes(stages: list, ranks: np.ndarray) -> int:
    """Nodes of the whole graph: ``ranks[i]`` ranks run ``stages[i]``."""
    return int(sum(int(n) * e.size for n, e in zip(ranks, stages, strict=True)))


def check_room(
    out: Path, nodes: int, *, simulated_nodes: int | None = None, available_memory: int | None = None,
    free_disk: int | None = None,
) -> None:  # fmt: skip
    """Stop before writing anything when a graph of ``nodes`` nodes would not fit this machine's
    free memory or the free space beside ``out`` (one BuildError line, with what it needs).
    ``simulated_nodes``: the nodes the simulation after the build holds (those of its distinct
    replicas, ``prism.graph.sim.folded``); None: not simulated."""
    simulated_after = simulated_nodes is not None
    memory = MEMORY_BASE_BYTES + max(
        BUILD_BYTES_PER_NODE * nodes, SIMULATE_BYTES_PER_NODE * (simulated_nodes or 0)
    )
    available = psutil.virtual_memory().available if available_memory is None else available_memory
    if memory > available:
        raise BuildError(
            f"the graph would have {nodes:,} nodes: {'building and simulating' if simulated_after else 'building'} it "
            f"needs about {memory / 2**30:.1f} GiB of memory and {available / 2**30:.1f} GiB are available; build "
            f"fewer ranks (--dp){', without --simulate' if simulated_after else ''} or on a larger machine"
        )
    disk, where = FILE_BYTES_PER_NODE * nodes, out.resolve().parent
    free = shutil.disk_usage(where).free if free_disk is None else free_disk
    if disk > free:
        raise BuildError(
            f"the graph would have {nodes:,} nodes, about {disk / 2**30:.2f} GiB on disk, and {where} "
            f"has {free / 2**30:.2f} GiB free"
        )


def _write(
    options: BuildOptions,
    metadata: GraphMetadata,
    stages: list,
    tables: LayoutTables,
    program: np.ndarray,
    progress,
) -> ValidationReport:
    """Write the graph row group by row group, each validated as it is written (beside the
    writing, on a thread of its own), each rank running its ``program`` of ``stages``; nothing is
    left behind on failure."""
    comm = CommModel(options.cluster)
    layout = tables.layout
    per_group = _row_group_ranks(options)
    step = max(1, BIND_RANKS // per_group) * per_group  # whole row groups a batch
    with RowGroupValidator(layout, metadata.model) as validator:
        with GraphWriter(
            options.out, metadata, ranks_per_row_group=per_group, on_row_group=validator.put
        ) as writer:
            for start in range(0, layout.world_size, step):
                ranks = np.arange(start, min(start + step, layout.world_size))
                # Runs of consecutive ranks of one program are bound together.
                cuts = np.flatnonzero(np.diff(program[ranks])) + 1
                for run in np.split(ranks, cuts):
                    writer.write_ranks(bind_ranks(stages[program[run[0]]], run, tables, comm))
                if progress is not None:
                    progress(int(ranks[-1]) + 1, layout.world_size)
        report = validator.report(str(options.out))
    if not report.ok:
        remove_graph(options.out)
        variants = rank_variants(metadata)
        if variants:  # the program singles ranks out in a way the variant rule does not bind
            v = variants[0]
            raise BuildError(
                f"the graph is invalid where ranks past the first on {v.axis} of stage {v.stage} run captured rank "
                f"{v.rank}'s calls: {report.problems[0]} (their groups' other ranks do not make those calls)"
            )
        raise BuildError(f"the built graph is invalid (a prism bug): {report.problems[0]}")
    return report
