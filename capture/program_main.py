"""One rank process of a program capture: ``python -m prism.capture.program_main --job job.json --rank R --out DIR``.

It becomes global rank R of the target world as torchrun would make it (the torchrun
environment of R; any backend the program asks for is prism's, ``prism.capture.interpose``),
runs the user's program as ``__main__``, cuts it into iterations at its optimizer steps
(``prism.capture.step_iterations``), profiles the last ``job.iterations`` of the first
``warmup + iterations``, then ends the program and writes its Kineto trace, Execution Trace,
comm log and result into the capture directory ``DIR``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from prism.capture.interpose import install
from prism.capture.launch import parse_rank_args
from prism.capture.profiling import ProfileSpec, profiled
from prism.capture.rank_main import layout_labeler, record_rank
from prism.capture.step_iterations import ProgramStop, StepIterations
from prism.peers.backend import VirtualWorld, current_comm_log
from prism.peers.clock import CommClock, FreeRunningClock
from prism.schemas.manifest import CaptureFiles, RankJob, RankResult
from prism.schemas.program import ProgramSpec


class ProgramRunError(RuntimeError):
    """The program did not give the capture what it needs (one line, for the launcher's log)."""


def run_program(program: ProgramSpec) -> None:
    """Run the program as ``__main__``, as ``python train.py ARGS`` or ``python -m mod ARGS`` would."""
    os.chdir(program.cwd)
    if program.module is not None:
        sys.argv = [program.module, *program.args]
        sys.path.insert(0, program.cwd)
        runpy.run_module(program.module, run_name="__main__", alter_sys=True)
        return
    script = Path(program.script).resolve()
    if not script.is_file():
        raise ProgramRunError(f"program not found: {program.script} (from {program.cwd})")
    sys.argv = [str(script), *program.args]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


def run_program_rank(job: RankJob, rank: int, out_dir: Path, *, clock: CommClock | None = None) -> RankResult:
    """Run ``rank`` of the program ``job`` and write its files under ``out_dir``."""
    started = time.perf_counter()
    program, clock = job.program, clock or FreeRunningClock()
    layout = program.layout
    os.environ.update(program.torchrun_env(rank))
    torch.set_num_threads(job.threads)
    world = VirtualWorld(real_ranks=job.real_ranks_for(rank), clock=clock, labeler=layout_labeler(layout))
    install(world, rank=rank, world_size=layout.world_size)
    files = CaptureFiles(out_dir)
    spec = ProfileSpec(
        warmup=job.warmup, iterations=job.iterations, kineto_path=files.kineto(rank), et_path=files.et(rank),
        cuda=program.device == "cuda",
    )  # fmt: skip
    total = job.warmup + job.iterations
    with profiled(spec) as prof:
        steps = StepIterations(
            rank=rank, total=total, profiled_from=job.warmup, stop_after_last=not program.run_to_end,
            profiler=prof, clock=clock,
            cuda=program.device == "cuda",
        )  # fmt: skip
        hook = register_optimizer_step_post_hook(steps)
        try:
            steps.start()
            run_program(program)
        except ProgramStop:
            pass
        except SystemExit as e:  # the program's own sys.exit(): an error only with a failing code
            if e.code not in (None, 0):
                raise
        finally:
            hook.remove()
            steps.finish()
    if not _initialized():
        raise ProgramRunError(
            "the program never initialised torch.distributed (init_process_group or init_device_mesh)"
        )
    if steps.done < total:
        raise ProgramRunError(
            f"the program ended after {steps.done} optimizer step(s); the capture needs {total} "
            f"(--warmup {job.warmup} + --iterations {job.iterations})"
        )
    timings = steps.timings
    return record_rank(
        files, rank, started=started, device=program.device, windows=timings.windows,
        iteration_ns=tuple(timings.iteration_ns), losses=(None,) * len(timings.iteration_ns),
        parameter_count=timings.parameters, static_bytes=timings.static_bytes,
    )  # fmt: skip


def _initialized() -> bool:
    try:
        current_comm_log()
    except RuntimeError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_rank_args("prism.capture.program_main", __doc__, argv)
    job = RankJob.from_dict(json.loads(args.job.read_text()))
    try:
        run_program_rank(job, args.rank, args.out.resolve())
    except ProgramRunError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
