"""Build graph.parquet from a capture of the user's own program: one stage program per pipeline
position, from its captured rank's traces alone (``prism.graph.build.program_stage``), bound to
every rank of the captured layout."""

from __future__ import annotations

from dataclasses import dataclass

from prism.graph.build.bind import encode_program
from prism.graph.build.normalize import normalize_rank
from prism.graph.build.profiler_overhead import Correction, time_scale
from prism.graph.build.program_stage import program_stage
from prism.graph.build.templates import TemplateError
from prism.graph.sim.noise import iteration_cv
from prism.schemas import PRISM_VERSION
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata
from prism.schemas.manifest import CapturedRank, CaptureManifest


@dataclass(frozen=True, kw_only=True)
class ProgramStages:
    """The encoded stage programs of a program's graph and the facts its metadata records."""

    stages: list
    """``EncodedProgram`` of every pipeline stage, in order."""
    metadata: GraphMetadata
    """The graph's file metadata."""


def _captured_stage(manifest: CaptureManifest, stage: int) -> CapturedRank:
    found = next((r for r in manifest.ranks if r.stage == stage), None)
    if found is None:
        captured = sorted({r.stage for r in manifest.ranks})
        raise TemplateError(
            f"pipeline stage {stage} was not captured (stages {captured} were); a program's graph needs "
            "one captured rank per pipeline position, prism-capture's default"
        )
    if found.result.static_bytes is None:
        raise TemplateError(f"rank {found.rank}'s result has no static_bytes: re-capture it with this prism")
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
    stages, scales, static = [], {}, []
    for stage in range(layout.pp):
        captured = _captured_stage(manifest, stage)
        ops = normalize_rank(capture_dir, captured.rank)
        scale = None
        if correction != Correction.NONE:
            # No block marks, no phase times: one ratio for the whole iteration.
            scale = time_scale(captured.result, manifest.job.warmup, by_phase=False)
        cv = iteration_cv(captured.result.own_iteration_ns, manifest.job.warmup)
        stage_program = program_stage(
            ops, rank=captured.rank, stage=stage, layout=layout, factor=scale.factor if scale else 1.0,
            noise_cv=cv,
        )  # fmt: skip
        stages.append(encode_program(stage_program))
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
        extra={gf.TIME_SCALE_KEY: scales or None, gf.STATIC_BYTES_KEY: static},
    )
    return ProgramStages(stages=stages, metadata=metadata)
