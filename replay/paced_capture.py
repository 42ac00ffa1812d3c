"""A paced capture: every role's rank captured again, its virtual peers timed by a graph.

A free-running capture completes every virtual call at once, so its slice runs its compute back
to back. In the full job a rank computes after waiting on its peers, and the same compute then
runs longer than back to back on the CPUs measured so far, so a graph built from a
free-running slice predicts short. A paced capture runs each role's rank as a replay of a graph
built from a first capture (``prism.replay.runtime``, one rank at a time, each alone), so the
templates it gives are of compute as it runs between the full job's waits.

Its directory is a capture directory (manifest mode ``paced``, the graph in ``notes``) that
``prism-build-graph`` reads like any other. The time prism held the program — the emulated
waits and the co-simulation's own work (``prism.schemas.comm_log.HeldTime``) — is in its traces
and iteration times; the build takes it out of both, so templates and the profiler correction
see the program's own time only.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch

from prism.capture.preflight import CaptureError, check_output
from prism.capture.runner import (
    CaptureHooks,
    captured_rank,
    device_name,
    machine_notes,
    rerun_command_template,
)
from prism.graph.io.parquet import GraphFormatError, read_metadata
from prism.replay.runtime import Progress, ReplayOptions, run_replay
from prism.schemas import PRISM_VERSION
from prism.schemas import graph_format as gf
from prism.schemas.files import write_json_atomic
from prism.schemas.iterations import DEFAULT_WARMUP
from prism.schemas.manifest import (
    PACED_MODE,
    CaptureFiles,
    CaptureManifest,
    RankJob,
    write_manifest,
)
from prism.schemas.workload import RecordError, record_device, record_layout


def paced_config(graph: Path) -> dict:
    """The built-in workload's record of ``graph`` (the model and layout a paced capture of it runs)."""
    try:
        model = read_metadata(graph).model
    except (GraphFormatError, ValueError, OSError) as e:
        raise CaptureError(f"{graph}: {str(e).splitlines()[0]}") from None
    if gf.PROGRAM_KEY in model:
        raise CaptureError(
            f"{graph} is the graph of your own program; paced captures are of the built-in GPT only so far"
        )
    try:
        record_layout(model), record_device(model)
    except (RecordError, ValueError) as e:
        raise CaptureError(f"{graph}: {str(e).splitlines()[0]}") from None
    return dict(model)


def run_paced_capture(
    graph: Path,
    out_dir: Path,
    *,
    warmup: int = DEFAULT_WARMUP,
    iterations: int = 2,
    threads: int = 1,
    overwrite: bool = False,
    rank_timeout_s: float = 1800.0,
    on_event: Progress | None = None,
    hooks: CaptureHooks | None = None,
) -> CaptureManifest:
    """Capture every role's rank of ``graph``'s job, paced by ``graph``; return the manifest.

    Bad input raises ``CaptureError`` (one line); a rank leaving the graph ``ReplayDiverged``."""
    config = paced_config(graph)
    check_output(out_dir, overwrite=overwrite)
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    layout = record_layout(config)
    roles = layout.roles()
    ranks = tuple(sorted(roles.values()))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.paced-", dir=out_dir.parent))
    try:
        run = tmp / "run"
        options = ReplayOptions(
            graph=graph, ranks=ranks, out_dir=run, warmup=warmup, iterations=iterations, threads=threads,
            separately=True, timeout_s=rank_timeout_s,
        )  # fmt: skip
        run_replay(options, on_event, hooks)
        # The replay directory has a capture directory's layout; its job becomes the program's.
        job = RankJob(
            workload="gpt",
            config=config,
            real_ranks=(),
            warmup=warmup,
            iterations=iterations,
            threads=threads,
        )
        write_json_atomic(CaptureFiles(run).job, job.to_dict())
        manifest = CaptureManifest(
            layout=layout,
            mode=PACED_MODE,
            job=job,
            ranks=tuple(captured_rank(run, r, layout) for r in ranks),
            rerun_command=rerun_command_template(),
            torch_version=torch.__version__,
            device=device_name(record_device(config)),
            host=socket.gethostname(),
            started_at=started_at,
            wall_s=round(time.perf_counter() - t0, 3),
            prism_version=PRISM_VERSION,
            notes={"paced_by": str(graph.resolve()), **machine_notes()},
        )
        write_manifest(manifest, run)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(run, out_dir)
        return manifest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
