"""Build graph.parquet from a capture of the user's own program: one stage program per pipeline
position, from its captured rank's traces alone (``prism.graph.build.program_stage``), bound to
every rank of the captured layout."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from pathlib import Path

from prism.graph.build.alike import call_sequence, check_alike
from prism.graph.build.bind import encode_program
from prism.graph.build.normalize import normalize_rank
from prism.graph.build.profiler_overhead import Correction, calls_are_launches, correction_scale
from prism.graph.build.program_stage import fitted_scale, program_stage
from prism.graph.build.templates import TemplateError
from prism.graph.sim.noise import iteration_cv
from prism.schemas import PRISM_VERSION
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.manifest import CapturedRank, CaptureFiles, CaptureManifest
from prism.schemas.received_values import value_pass_rank


@dataclass(frozen=True, kw_only=True)
class ProgramStages:
    """The encoded stage programs of a program's graph and the facts its metadata records."""

    stages: list
    """``EncodedProgram`` of every pipeline stage, in order."""
    metadata: GraphMetadata
    """The graph's file metadata."""


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


def _check_alike(manifest: CaptureManifest, sources: dict[int, CapturedRank], layout, ops) -> None:
    """Captured ranks that stand for the same ranks made the same calls."""

    def sequences(ranks: list[int]) -> dict[int, list]:
        return {rank: call_sequence(ops(rank), rank, layout) for rank in ranks}

    by_stage: dict[int, list[int]] = {}
    for captured in sorted(manifest.ranks, key=lambda r: r.rank):
        by_stage.setdefault(captured.stage, []).append(captured.rank)
    for stage, ranks in sorted(by_stage.items()):
        for other in ranks[1:]:
            check_alike(
                sequences([ranks[0], other]),
                f"both run pipeline stage {stage} (rank {other} {_where(layout, ranks[0], other)})",
            )
    if any(source.stage != stage for stage, source in sources.items()):
        middles = [ranks[0] for stage, ranks in sorted(by_stage.items()) if 0 < stage < layout.pp - 1]
        if len(middles) > 1:
            check_alike(
                sequences(middles),
                "both stand for every middle stage (capture every stage with --roles pipeline)",
            )


def _where(layout, base: int, other: int) -> str:
    """Where ``other`` stands apart from ``base`` on the mesh: 'at cp 1 of 2, ep 3 of 4'."""
    a, b = layout.fine_coords(base), layout.fine_coords(other)
    apart = [
        f"{axis} {b[axis]} of {layout.degree(axis)}" for axis in layout.stage_axes() if a[axis] != b[axis]
    ]
    return "at " + ", ".join(apart) if apart else "at the same place"


def _received_values(capture_dir, layout) -> dict[str, str]:
    """Each stage's value-pass file, base64, for replays (none without a value pass)."""
    files = CaptureFiles(Path(capture_dir))
    found = {}
    for stage in range(layout.pp):
        path = files.values(value_pass_rank(layout, stage))
        if path.is_file():
            found[str(stage)] = base64.b64encode(path.read_bytes()).decode("ascii")
    return found


def program_stages(
    capture_dir,
    manifest: CaptureManifest,
    *,
    cluster: dict,
    digest: str,
    options: dict,
    correction: Correction,
) -> ProgramStages:
    """Every stage's program and the graph metadata of a program capture at its own layout."""
    program = manifest.job.program
    layout = program.layout
    sources = _stage_sources(manifest, layout.pp)
    ops = functools.cache(lambda rank: normalize_rank(capture_dir, rank))
    _check_alike(manifest, sources, layout, ops)
    stages, scales, static = [], {}, []
    for stage in range(layout.pp):
        captured = sources[stage]
        ops_of_stage = ops(captured.rank)
        scale = correction_scale(captured.result, manifest.job.warmup, correction, manifest.job.device)
        scale = scale and fitted_scale(ops_of_stage, scale)
        cv = iteration_cv(captured.result.own_iteration_ns, manifest.job.warmup)
        stage_program = program_stage(
            ops_of_stage, rank=captured.rank, stage=stage, layout=layout, scale=scale,
            launches=calls_are_launches(manifest.job.device), noise_cv=cv,
        )  # fmt: skip
        stages.append(encode_program(stage_program, layout))
        if scale is not None:
            scales[str(stage)] = scale.to_dict() | {"noise_cv": round(cv, 6)}
        static.append(int(captured.result.static_bytes))
    metadata = GraphMetadata(
        layout=layout.to_dict(),
        model={gf.PROGRAM_KEY: program.to_dict()},
        cluster=cluster,
        capture_digest=digest,
        build_options=options,
        prism_version=PRISM_VERSION,
        extra={
            gf.TIME_SCALE_KEY: scales or None,
            gf.STATIC_BYTES_KEY: static,
            gf.RECEIVED_VALUES_KEY: _received_values(capture_dir, layout),
            gf.STEADY_FROM_KEY: max(r.result.steady_from or 1 for r in manifest.ranks),
        },
    )
    return ProgramStages(stages=stages, metadata=metadata)
