"""Build graph.parquet from a capture of the user's own program: one stage program per pipeline
position, from its captured rank's traces alone (``prism.graph.build.program_stage``), bound to
every rank of the captured layout, and one more for each stage whose ranks past the first on an
axis call differently (``prism.schemas.rank_programs``). A program can be built at another layer count than
the one captured (``prism.graph.build.layer_passes``): each stage walks an equal share of them
and holds their parameters; or at another microbatch count (``prism.graph.build.microbatch_steps``);
or bound to another data-parallel degree (``prism.graph.build.resized_groups``); or at another
pipeline depth, each stage a captured one at its place (``prism.graph.build.pipeline_depth``)."""

from __future__ import annotations

import base64
import functools
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from prism.graph.build.alike import call_sequence, check_alike
from prism.graph.build.bind import encode_program
from prism.graph.build.bucket_calls import BucketCaps
from prism.graph.build.layer_passes import LayerTarget
from prism.graph.build.microbatch_steps import MicrobatchTarget, microbatch_notes, microbatch_steps
from prism.graph.build.normalize import (
    freed_of_layer,
    freed_of_rows,
    memory_addresses,
    normalize_rank,
    rank_trace,
)
from prism.graph.build.pipeline_depth import ONE_F_ONE_B, schedule_kind, target_warmup, warmup_forwards
from prism.graph.build.profiler_overhead import Correction, calls_are_launches, correction_scale
from prism.graph.build.program_stage import common_iterations, fitted_scale, program_stage
from prism.graph.build.rank_variants import Found, find_variants, variant_line
from prism.graph.build.resized_groups import check_resizable
from prism.graph.build.retarget import first_layer, held_blocks, parameter_sources, stage_parameters
from prism.graph.build.templates import TemplateError
from prism.graph.sim.noise import iteration_cv
from prism.schemas import PRISM_VERSION
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.held_parameters import HeldParameters
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import CapturedRank, CaptureFiles, CaptureManifest
from prism.schemas.received_values import read_received_values, value_pass_rank, write_received_values


@dataclass(frozen=True, kw_only=True)
class ProgramStages:
    """The encoded stage programs of a program's graph and the facts its metadata records."""

    stages: list
    """``EncodedProgram`` of every program the ranks run, by program number: each pipeline
    stage's, then each rank variant's (``prism.schemas.rank_programs``)."""
    metadata: GraphMetadata
    """The graph's file metadata."""
    notes: tuple[str, ...] = ()
    """What the user should know of the ranks it binds (a variant's line each)."""


def _stage_sources(manifest: CaptureManifest, pp: int) -> dict[int, CapturedRank]:
    """The captured rank whose calls each stage runs: its own, or for a middle stage that was not
    captured (``--roles first-middle-last``), the nearest captured middle one."""
    captured: dict[int, list[CapturedRank]] = {}
    for rank in sorted(manifest.ranks, key=lambda r: r.rank):
        if rank.result.static_bytes is None:
            raise TemplateError(
                f"rank {rank.rank}'s result has no static_bytes: re-capture it with this prism"
            )
        captured.setdefault(rank.stage, []).append(rank)
    middles = [stage for stage in captured if 0 < stage < pp - 1]
    sources = {}
    for stage in range(pp):
        if stage in captured:
            sources[stage] = captured[stage][0]
        elif 0 < stage < pp - 1 and middles:
            sources[stage] = captured[min(middles, key=lambda m: (abs(m - stage), m))][0]
        else:
            raise TemplateError(
                f"pipeline stage {stage} was not captured (stages {sorted(captured)} were); a program's graph "
                "needs its first and last stage and, for the middle ones, every middle stage or two of "
                "them (prism-capture --roles pipeline or first-middle-last)"
            )
    return sources


def _variants(manifest: CaptureManifest, sources: dict[int, CapturedRank], layout, ops) -> list[Found]:
    """Captured ranks that stand for the same ranks made the same calls, up to the variants of
    ``--roles axis-ends`` (``prism.graph.build.rank_variants``)."""
    calls = functools.cache(lambda rank: call_sequence(ops(rank), rank, layout))
    by_stage: dict[int, list[CapturedRank]] = {}
    for captured in sorted(manifest.ranks, key=lambda r: r.rank):
        by_stage.setdefault(captured.stage, []).append(captured)
    variants = find_variants(layout, by_stage, calls)
    if any(source.stage != stage for stage, source in sources.items()):
        middles = [ranks[0].rank for stage, ranks in sorted(by_stage.items()) if 0 < stage < layout.pp - 1]
        if len(middles) > 1:
            check_alike(
                {rank: calls(rank) for rank in middles},
                "both stand for every middle stage (capture every stage with --roles pipeline)",
            )
    return variants


def _received_values(
    capture_dir, layout: ParallelLayout, target: ParallelLayout, sources: dict[int, CapturedRank]
) -> dict[str, str]:
    """Each target stage's value-pass file (its source's captured stage's, its peers renamed to
    the target's ranks at the same stage offsets), base64, for replays (none without a value pass)."""
    files = CaptureFiles(Path(capture_dir))
    found = {}
    for stage, source in sources.items():
        path = files.values(value_pass_rank(layout, source.stage))
        if not path.is_file():
            continue
        data = path.read_bytes()
        if target != layout:
            _, received = read_received_values(path)
            moved = {
                value_pass_rank(target, stage + layout.stage(peer) - source.stage): values
                for peer, values in received.items()
            }
            with tempfile.TemporaryDirectory() as tmp:
                write_received_values(Path(tmp) / "values.pt", value_pass_rank(target, stage), moved)
                data = (Path(tmp) / "values.pt").read_bytes()
        found[str(stage)] = base64.b64encode(data).decode("ascii")
    return found


def _captured_share(manifest: CaptureManifest) -> tuple[dict[tuple[int, int], int], int]:
    """The layers each captured stage holds ((stage, part) to count: a rank holding several
    stages, an interleaved schedule's, holds a part in each), and how many parts a rank holds."""
    held = {(r.stage, c): len(b) for r in manifest.ranks for c, b in enumerate(held_blocks(_held(r)))}
    return held, 1 + max(c for _, c in held)


def _captured_layers(manifest: CaptureManifest) -> int:
    """The layers of the captured model, for another pipeline depth: each stage's share, as many
    as there are stages. Refused where no stage holds layer blocks (a program without layer
    marks), whose split over another number of stages is not known."""
    held, parts = _captured_share(manifest)
    if not any(held.values()):
        raise TemplateError(
            "the capture marks no layer blocks on any stage: how the model splits over another number of pipeline "
            "stages is not known; capture at the target pp"
        )
    return max(held.values()) * manifest.job.program.layout.pp * parts


def _depth_sources(
    manifest: CaptureManifest, ops, layout: ParallelLayout, pp: int, microbatches: int | None
) -> tuple[dict[int, CapturedRank], dict[int, int | None]]:
    """At ``pp`` stages (``layout``'s the captured ones): the captured rank each stage runs as
    (the first and last stages the captured first and last, a middle one the captured middle one
    whose warm-up is nearest its own), and the warm-up forwards each runs
    (``prism.graph.build.pipeline_depth``)."""
    captured = {r.stage: r for r in sorted(manifest.ranks, key=lambda r: -r.rank)}
    steps = {s: microbatch_steps(common_iterations(ops(r.rank))[0]) for s, r in captured.items()}
    counts = {st.microbatches for st in steps.values()}
    if len(counts) != 1:
        raise TemplateError(f"the captured stages run {sorted(counts)} microbatches: one count is needed")
    m = counts.pop()
    kind = schedule_kind({s: warmup_forwards(st) for s, st in steps.items()}, layout.pp, m)
    target_m = microbatches or m
    if kind == ONE_F_ONE_B and target_m < pp:
        raise TemplateError(
            f"a 1F1B pipeline of {pp} stages needs as many microbatches or more (torch's Schedule1F1B refuses fewer), "
            f"and the graph runs {target_m}: give --microbatches {pp} or more"
        )
    middles = [s for s in captured if 0 < s < layout.pp - 1]
    sources, warmups = {}, {}
    for stage in range(pp):
        warmups[stage] = target_warmup(kind, stage=stage, pp=pp, microbatches=target_m)
        if stage in (0, pp - 1):
            sources[stage] = captured[0 if stage == 0 else layout.pp - 1]
            continue
        if not middles:
            raise TemplateError(
                f"pipeline stage {stage} of {pp} is a middle stage and the capture has none (pp={layout.pp}): capture "
                "with 3 or more pipeline stages to build a deeper pipeline"
            )
        # Under 1F1B a middle stage's warm-up is pp - stage - 1, as is the captured one's.
        nearest = min(middles, key=lambda s: (abs((layout.pp - s - 1) - (pp - stage - 1)), s))
        sources[stage] = captured[nearest]
    return sources, warmups


def _layer_shift(captured: CapturedRank, stage: int, pp: int) -> int:
    """How far the layer numbers of ``captured``'s blocks move where it runs as ``stage`` of ``pp``
    with as many layers: none where each stage numbers its own from 0, else to the stage's place
    in the stack (``prism.graph.build.retarget.first_layer``)."""
    (blocks,) = held_blocks(_held(captured))
    if not blocks:
        return 0
    first = first_layer(
        blocks[0], len(blocks), captured_stage=captured.stage, stage=stage, pp=pp, per_stage=len(blocks)
    )
    return first - blocks[0]


def _held(captured: CapturedRank) -> HeldParameters:
    held = captured.result.parameters
    if held is None:
        raise TemplateError(
            f"rank {captured.rank}'s result records no parameters (a capture by an earlier prism): re-capture it "
            "with this prism to change its layer count"
        )
    return held


def _stage_layers(manifest: CaptureManifest, layers: int, pp: int) -> int:
    """Layers each pipeline stage holds at ``layers`` in all: an equal share, as the capture's
    stages do (a rank holding several stages, an interleaved schedule's, holds a share in each)."""
    held, parts = _captured_share(manifest)
    stages = pp * parts
    if layers % stages:
        raise TemplateError(
            f"--layers {layers} with {stages} pipeline stages: every stage holds an equal share of the layers, "
            f"so a multiple of {stages}"
        )
    if len(set(held.values())) > 1:
        read = ", ".join(f"{n} (stage {s}{f' part {c}' if c else ''})" for (s, c), n in sorted(held.items()))
        raise TemplateError(
            f"the captured stages hold {read} layers: --layers splits the target's equally among stages, "
            "as only a capture of equal stages shows; capture at the target layer count"
        )
    return layers // stages


def _layer_target(
    traces, captured: CapturedRank, ops, *, stage: int, per_stage: int, pp: int
) -> tuple[LayerTarget, int]:
    """A captured rank's program as pipeline ``stage`` holding ``per_stage`` layers (in each of
    its stages, where it holds several), and the static bytes it then holds: the captured ones
    with what its parameters hold at the target count in place of those captured
    (``prism.graph.build.retarget.stage_parameters``). Layers are numbered as the capture numbers
    them: from 0 in each stage, or across stages (``retarget.first_layer``)."""
    held = _held(captured)
    blocks = held_blocks(held)
    firsts = [
        first_layer(
            b[0] if b else 0, len(b), captured_stage=captured.stage, stage=stage, pp=pp, per_stage=per_stage
        )
        for b in blocks
    ]
    stacks = [range(first, first + per_stage) for first in firsts]
    target = stage_parameters(held, stacks)
    static = int(captured.result.static_bytes) + sum(target.held_bytes) - sum(held.held_bytes)
    if held.bucket_copies:  # DDP's buckets hold a copy of each gradient
        static += (sum(target.numels) - sum(held.numels)) * held.itemsize
    caps = (
        BucketCaps(
            bucket_bytes=held.bucket_bytes, first_bucket_bytes=held.first_bucket_bytes, itemsize=held.itemsize
        )
        if held.bucket_bytes
        else None
    )
    keys = [held.stages[chunk[0]] for chunk in held.chunks()] if held.stages else [-1]
    first_block = [i for i in held.chunks()[0] if held.layers[i] == blocks[0][0]] if blocks[0] else []
    return (
        LayerTarget(
            layers=per_stage,
            first_layers=dict(zip(keys, firsts, strict=True)),
            parameter_sources=tuple(parameter_sources(held, stacks)),
            parameter_elements=held.numels,
            parameter_stages=held.stages,
            freed_of_layer=lambda stage, layer: freed_of_layer(
                traces(captured.rank), captured.rank, ops(captured.rank), layer, stage
            ),
            freed_of_rows=lambda rows: freed_of_rows(
                traces(captured.rank), captured.rank, ops(captured.rank), rows
            ),
            rows=len(ops(captured.rank)),
            layer_bytes=sum(held.numels[i] for i in first_block) * held.itemsize,
            bucket_caps=caps,
        ),
        static,
    )


def program_stages(
    capture_dir,
    manifest: CaptureManifest,
    *,
    cluster: dict,
    digest: str,
    options: dict,
    correction: Correction,
    layers: int | None = None,
    microbatches: int | None = None,
    target: ParallelLayout | None = None,
) -> ProgramStages:
    """Every stage's program and the graph metadata of a program capture at its own layout, or
    bound to ``target``, another data-parallel degree (``prism.graph.build.resized_groups``);
    with ``layers``, each stage walking its equal share of them (``prism.graph.build.layer_passes``);
    with ``microbatches``, each running that many (``prism.graph.build.microbatch_steps``)."""
    program = manifest.job.program
    layout = program.layout
    target = target or layout
    pp = target.pp
    captured_layers = _captured_layers(manifest) if pp != layout.pp else None
    layers = captured_layers if layers is None else layers
    per_stage = None if layers is None else _stage_layers(manifest, layers, pp)
    if captured_layers is not None and layers * layout.pp == captured_layers * pp:
        per_stage = None  # each stage holds as many layers as captured: only its place changes
    sources = _stage_sources(manifest, layout.pp)
    ops = functools.cache(lambda rank: normalize_rank(capture_dir, rank))
    # Each captured rank's trace is read once, for every change that traces frees by address.
    traces = functools.cache(lambda rank: rank_trace(capture_dir, rank))
    variants = _variants(manifest, sources, layout, ops)
    warmups = dict.fromkeys(range(pp))
    if pp != layout.pp:
        if variants:
            raise TemplateError(
                "ranks of a stage call differently (rank variants): how they do at another pipeline depth is not "
                f"known; capture at {target}"
            )
        sources, warmups = _depth_sources(manifest, ops, layout, pp, microbatches)
    programs = [(str(stage), stage, sources[stage]) for stage in range(pp)]
    programs += [(f"{v.stage}.{v.axis}", v.stage, captured) for v, captured, _ in variants]
    check_resizable(
        ((captured.rank, ops(captured.rank)) for _, _, captured in programs),
        (v.axis for v, _, _ in variants), layout, target,
    )  # fmt: skip
    stages, scales, statics, schedules = [], {}, {}, {}
    for key, stage, captured in programs:
        ops_of_stage = ops(captured.rank)
        retarget, statics[key] = (
            _layer_target(traces, captured, ops, stage=stage, per_stage=per_stage, pp=pp)
            if per_stage is not None
            else (None, int(captured.result.static_bytes))
        )
        scale = correction_scale(captured.result, manifest.job.warmup, correction, manifest.job.device)
        scale = scale and fitted_scale(ops_of_stage, scale)
        cv = iteration_cv(captured.result.own_iteration_ns, manifest.job.warmup)
        stage_program = program_stage(
            ops_of_stage, rank=captured.rank, stage=stage, layout=layout, scale=scale,
            launches=calls_are_launches(manifest.job.device), noise_cv=cv, retarget=retarget,
            microbatches=_microbatch_target(traces, captured, ops, microbatches), target=target,
            warmup=warmups.get(stage) if key == str(stage) else None,
            layer_shift=_layer_shift(captured, stage, pp) if per_stage is None and pp != layout.pp else 0,
        )  # fmt: skip
        statics[key] += stage_program.held_bytes
        if stage_program.microbatches is not None:
            schedules[key] = stage_program.microbatches.schedule
            statics[key] += stage_program.microbatches.static_bytes
        stages.append(encode_program(stage_program, target))
        if scale is not None:
            scales[key] = scale.to_dict() | {"noise_cv": round(cv, 6)}
    static = [statics[str(stage)] for stage in range(pp)]
    if layers is not None:
        options = {**options, "layers": layers}
    if target != layout:
        options = {**options, gf.CAPTURED_LAYOUT_KEY: layout.to_dict()}
    notes = ()
    if microbatches is not None:
        options = {**options, "microbatches": microbatches}
        notes = microbatch_notes(schedules, microbatches)
    metadata = GraphMetadata(
        layout=target.to_dict(),
        model={gf.PROGRAM_KEY: replace(program, layout=target).to_dict()},
        cluster=cluster,
        capture_digest=digest,
        build_options=options,
        prism_version=PRISM_VERSION,
        extra={
            gf.TIME_SCALE_KEY: scales or None,
            gf.STATIC_BYTES_KEY: static,
            gf.RANK_VARIANTS_KEY: [v.to_dict() for v, _, _ in variants],
            gf.RECEIVED_VALUES_KEY: _received_values(capture_dir, layout, target, sources),
            gf.STEADY_FROM_KEY: max(r.result.steady_from or 1 for r in manifest.ranks),
        },
    )
    notes += tuple(variant_line(v, layout, why) for v, _, why in variants)
    return ProgramStages(stages=stages, metadata=metadata, notes=notes)


def _microbatch_target(
    traces, captured: CapturedRank, ops, microbatches: int | None
) -> MicrobatchTarget | None:
    if microbatches is None:
        return None
    return MicrobatchTarget(
        microbatches=microbatches,
        freed_of_rows=lambda rows: freed_of_rows(
            traces(captured.rank), captured.rank, ops(captured.rank), rows
        ),
        memory_addresses=lambda: memory_addresses(traces(captured.rank)),
    )
